// Top-k / top-p / min-p cutoffs of core/filter_math.h on rows whose answer is
// known in closed form, and the order key the radix passes rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/filter_math.h"
#include "core/sampling_reference.h"

using namespace specdec;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

float cutoff(const std::vector<float>& row, FilterSpec f, float t = 1.0f) {
  const SoftmaxStats st = reference_stats(row.data(), row.size(), 1.0f / t);
  return filter_cutoff_reference(row.data(), row.size(), st.max, 1.0f / t, f);
}
FilterSpec topk(int64_t k) { FilterSpec f; f.top_k = k; return f; }
FilterSpec topp(float p) { FilterSpec f; f.top_p = p; return f; }
FilterSpec minp(float p) { FilterSpec f; f.min_p = p; return f; }
}  // namespace

TEST(FilterMath, OrderKeyIsMonotoneAndInvertible) {
  const std::vector<float> xs = {-kInf, -3e38f, -1.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, 3e38f, kInf};
  for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_LE(order_key(xs[i]), order_key(xs[i + 1])) << i;
  for (float x : xs) EXPECT_EQ(key_to_float(order_key(x)), x);
  EXPECT_LT(order_key(-1.5f), order_key(-1.0f));
}

TEST(FilterMath, TopKKeepsTiesAtTheBoundary) {
  const std::vector<float> row = {1.0f, 5.0f, 3.0f, 3.0f, -2.0f, 4.0f};
  EXPECT_EQ(cutoff(row, topk(1)), 5.0f);
  EXPECT_EQ(cutoff(row, topk(2)), 4.0f);
  EXPECT_EQ(cutoff(row, topk(3)), 3.0f);  // both 3.0 survive: 4 tokens
  EXPECT_EQ(cutoff(row, topk(4)), 3.0f);
  EXPECT_EQ(cutoff(row, topk(5)), 1.0f);
  EXPECT_EQ(cutoff(row, topk(6)), -kInf);  // k >= V: off
  EXPECT_EQ(cutoff(row, topk(0)), -kInf);
}

TEST(FilterMath, TopKCountsMaskedTokens) {
  const std::vector<float> row = {-kInf, 2.0f, -kInf, 1.0f};
  EXPECT_EQ(cutoff(row, topk(2)), 1.0f);
  EXPECT_EQ(cutoff(row, topk(3)), -kInf);
}

TEST(FilterMath, TopPUsesStrictlyHigherMass) {
  // p = 0.5, 0.25, 0.125, 0.125 (logits log2 apart)
  const float l2 = std::log(2.0f);
  const std::vector<float> row = {3 * l2, 2 * l2, l2, l2};
  EXPECT_EQ(cutoff(row, topp(0.4f)), 3 * l2);   // above the max: 0 < 0.4; above the 2nd: 0.5
  EXPECT_EQ(cutoff(row, topp(0.6f)), 2 * l2);   // 0.5 < 0.6, 0.75 >= 0.6
  EXPECT_EQ(cutoff(row, topp(0.8f)), l2);       // 0.75 < 0.8: both 0.125 tokens kept (ties)
  EXPECT_EQ(cutoff(row, topp(1.0f)), -kInf);    // off
}

TEST(FilterMath, TopPRenormalisesOverTopK) {
  // top-k 2 leaves p' = 2/3, 1/3: top-p 0.6 keeps only the first, 0.7 both
  const float l2 = std::log(2.0f);
  const std::vector<float> row = {3 * l2, 2 * l2, l2, 0.0f};
  FilterSpec f = topk(2);
  f.top_p = 0.6f;
  EXPECT_EQ(cutoff(row, f), 3 * l2);
  f.top_p = 0.7f;
  EXPECT_EQ(cutoff(row, f), 2 * l2);
}

TEST(FilterMath, MinPIsRelativeToTheMaxAndUsesTheTemperature) {
  const float l2 = std::log(2.0f);
  const std::vector<float> row = {0.0f, -l2, -2 * l2, -3 * l2};  // p / max p = 1, 1/2, 1/4, 1/8
  EXPECT_EQ(cutoff(row, minp(0.3f)), -l2);
  EXPECT_EQ(cutoff(row, minp(0.2f)), -2 * l2);
  EXPECT_EQ(cutoff(row, minp(0.3f), 2.0f), -3 * l2);  // T = 2: ratios 1, .71, .5, .35
}

TEST(FilterMath, TheMaxAlwaysSurvives) {
  const std::vector<float> row = {0.0f, 0.0f, 0.0f, 10.0f};
  FilterSpec f = topk(1);
  f.top_p = 1e-6f;
  f.min_p = 0.999f;
  EXPECT_EQ(cutoff(row, f), 10.0f);
}

TEST(FilterMath, FilteredSampleNeverLeavesTheKeptSet) {
  const std::vector<float> row = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  float probs[6];
  for (uint64_t s = 0; s < 200; ++s) {
    const int64_t t = sample_row_reference(row.data(), 6, 1.0f, RowRng(s, 0), probs, topk(2));
    EXPECT_TRUE(t == 4 || t == 5) << t;
  }
  EXPECT_EQ(probs[0] + probs[1] + probs[2] + probs[3], 0.0f);
  EXPECT_NEAR(probs[4] + probs[5], 1.0f, 1e-6f);
}

TEST(FilterMath, ValidFilterRule) {
  EXPECT_TRUE(valid_filter(FilterSpec{}));
  EXPECT_FALSE(valid_filter(topk(-1)));
  EXPECT_FALSE(valid_filter(topp(0.0f)));
  EXPECT_FALSE(valid_filter(topp(1.5f)));
  EXPECT_FALSE(valid_filter(minp(1.0f)));
  EXPECT_FALSE(valid_filter(minp(-0.1f)));
  EXPECT_FALSE(valid_filter(topp(std::nanf(""))));
}
