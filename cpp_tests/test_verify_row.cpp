// The per-row algorithm on raw arrays (core/verify_math.h): merges, ratio test,
// race, and the scalar reference of one verify row, including a chi-square check
// of its output law.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/sampling_reference.h"

namespace {
using namespace specdec;
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Stats, MergeMatchesDirectComputation) {
  std::vector<float> x = {1.f, -2.f, 3.5f, 0.25f, -kInf, 2.f};
  const SoftmaxStats all = reference_stats(x.data(), x.size(), 1.0f);
  SoftmaxStats a = reference_stats(x.data(), 3, 1.0f), b = reference_stats(x.data() + 3, 3, 1.0f);
  const SoftmaxStats m1 = stats_merge(a, b, 1.0f), m2 = stats_merge(b, a, 1.0f);
  EXPECT_FLOAT_EQ(m1.max, all.max);
  EXPECT_NEAR(m1.sum, all.sum, 1e-5);
  EXPECT_NEAR(m2.sum, all.sum, 1e-5);
  EXPECT_EQ(stats_merge(stats_empty(), a, 1.0f).sum, a.sum);
  EXPECT_EQ(stats_merge(a, stats_empty(), 1.0f).sum, a.sum);
}

TEST(RatioTest, NeverAcceptsZeroProbability) {
  EXPECT_FALSE(ratio_test_accepts(uniform_open01(0u), 1.0f, 1.0f, 0.0f));
  EXPECT_TRUE(ratio_test_accepts(0.5f, 0.2f, 1.0f, 0.3f));   // p >= q: always
  EXPECT_FALSE(ratio_test_accepts(0.9f, 0.4f, 1.0f, 0.2f));  // u > p / q
}

TEST(Race, TiesGoToTheLowestIndexWhateverTheMergeOrder) {
  const RaceBest a{2.0f, 7}, b{2.0f, 3}, c{1.0f, 0};
  EXPECT_EQ(race_merge(race_merge(a, b), c).index, 3);
  EXPECT_EQ(race_merge(c, race_merge(b, a)).index, 3);
}

TEST(BadValues, Classification) {
  EXPECT_TRUE(bad_logit(std::nanf("")));
  EXPECT_TRUE(bad_logit(kInf));
  EXPECT_FALSE(bad_logit(-kInf));
  EXPECT_TRUE(bad_prob(-1e-9f));
  EXPECT_TRUE(bad_prob(std::nanf("")));
  EXPECT_FALSE(bad_prob(0.0f));
}

TEST(ReferenceRow, GreedyAcceptsMatchingPrefix) {
  // V = 4, K = 2: argmax per position = 1, 2, 3.
  const float logits[] = {0, 5, 1, 1, 0, 0, 9, 1, 0, 0, 0, 4};
  const int64_t drafts[] = {1, 0};
  int64_t tokens[3];
  const auto r = verify_row_reference(logits, nullptr, drafts, 2, 4, 0.0f, RowRng(1, 0), tokens);
  EXPECT_TRUE(r.valid);
  EXPECT_EQ(r.num_accepted, 1);
  EXPECT_EQ(tokens[0], 1);
  EXPECT_EQ(tokens[1], 2);
  EXPECT_EQ(tokens[2], -1);
}

TEST(ReferenceRow, InvalidInputs) {
  std::vector<float> logits(3 * 5, 0.0f);
  const int64_t drafts[] = {1, 2};
  int64_t tokens[3];
  logits[12] = std::nanf("");  // bonus position
  EXPECT_FALSE(verify_row_reference(logits.data(), nullptr, drafts, 2, 5, 1.0f, RowRng(1, 0), tokens).valid);
  logits[12] = 0.0f;
  const int64_t bad_drafts[] = {1, 5};
  EXPECT_FALSE(verify_row_reference(logits.data(), nullptr, bad_drafts, 2, 5, 1.0f, RowRng(1, 0), tokens).valid);
  EXPECT_FALSE(verify_row_reference(logits.data(), nullptr, drafts, 2, 5, -1.0f, RowRng(1, 0), tokens).valid);
  EXPECT_EQ(tokens[0], -1);
}

// (l - max) * (1/T): the max token weighs exactly 1 whatever T, so s >= 1 and a
// row of finite logits always has a token (issue 11).
TEST(ReferenceRow, ExtremeTemperaturesAndLogits) {
  for (float t : {1e-38f, 1e-20f, 1e-9f, 1.0f, 1e20f, 3e38f})
    for (float m : {6.34375f, 3e38f, -3e38f, 0.0f}) EXPECT_EQ(shifted_exp(m, m, 1.0f / t), 1.0f);
  int64_t tokens[1];
  const float tiny[] = {6.34375f, 6.0f};
  auto r = verify_row_reference(tiny, nullptr, nullptr, 0, 2, 1e-20f, RowRng(1, 0), tokens);
  EXPECT_TRUE(r.valid);
  EXPECT_EQ(tokens[0], 0);
  const float huge[] = {0.0f, 3e38f, -3e38f};
  for (float t : {1e-38f, 0.5f, 3e38f}) {
    r = verify_row_reference(huge, nullptr, nullptr, 0, 3, t, RowRng(2, 0), tokens);
    EXPECT_TRUE(r.valid) << t;
    EXPECT_GE(tokens[0], 0);
    EXPECT_LT(tokens[0], 3);
  }
  r = verify_row_reference(huge, nullptr, nullptr, 0, 3, 1e-38f, RowRng(2, 0), tokens);
  EXPECT_EQ(tokens[0], 1);  // point mass at the argmax
  EXPECT_FALSE(verify_row_reference(huge, nullptr, nullptr, 0, 3, 1e-40f, RowRng(2, 0), tokens).valid);
}

TEST(ReferenceRow, SampleRow) {
  const float logits[] = {1.0f, -kInf, 3e38f, 0.5f, 2.0f};
  float probs[5];
  EXPECT_EQ(sample_row_reference(logits, 5, 1e-3f, RowRng(3, 0), probs), 2);  // point mass
  EXPECT_EQ(probs[2], 1.0f);
  const float small[] = {1.0f, -kInf, 0.0f, 0.5f, 2.0f};
  const int64_t t = sample_row_reference(small, 5, 1.0f, RowRng(3, 0), probs);
  EXPECT_TRUE(t >= 0 && t < 5 && t != 1);
  float sum = 0.0f;
  for (float p : probs) sum += p;
  EXPECT_NEAR(sum, 1.0f, 1e-6f);
  EXPECT_EQ(probs[1], 0.0f);
  EXPECT_EQ(sample_row_reference(small, 5, 0.0f, RowRng(3, 0), probs), 4);
  EXPECT_EQ(probs[4], 1.0f);
  const float bad[] = {1.0f, std::nanf("")};
  EXPECT_EQ(sample_row_reference(bad, 2, 1.0f, RowRng(3, 0), probs), -1);
  EXPECT_EQ(probs[0], 0.0f);
}

// Chi-square of the reference's (num_accepted, token) law against the closed
// form, K = 1, V = 5, 200k rows with distinct offsets. 7 possible cells (the residual
// is non-zero at tokens 0 and 4 only; 5 bonus tokens). Critical value of the
// chi-square distribution with 6 degrees of freedom at significance 1e-3: 22.46.
TEST(ReferenceRow, DistributionMatchesClosedForm) {
  const int V = 5, K = 1;
  const float logits[] = {0.5f, 1.0f, -0.5f, 0.0f, 2.0f, /* bonus */ 1.0f, 0.0f, 0.2f, -1.0f, 0.3f};
  const float q[] = {0.1f, 0.5f, 0.1f, 0.2f, 0.1f};
  const int64_t draft[] = {1};
  double p0[5], p1[5], z0 = 0, z1 = 0;
  for (int v = 0; v < V; ++v) z0 += std::exp(double(logits[v])), z1 += std::exp(double(logits[V + v]));
  for (int v = 0; v < V; ++v) p0[v] = std::exp(double(logits[v])) / z0, p1[v] = std::exp(double(logits[V + v])) / z1;
  const double a = std::min(1.0, p0[1] / q[1]);
  double resid[5], rz = 0;
  for (int v = 0; v < V; ++v) resid[v] = std::max(0.0, p0[v] - q[v]), rz += resid[v];
  std::vector<double> expected(2 * V);
  for (int v = 0; v < V; ++v) expected[v] = (1 - a) * resid[v] / rz, expected[V + v] = a * p1[v];

  const int n = 200000;
  std::vector<double> counts(2 * V, 0.0);
  int64_t tokens[2];
  for (int i = 0; i < n; ++i) {
    const auto r = verify_row_reference(logits, q, draft, K, V, 1.0f, RowRng(12345, uint64_t(i)), tokens);
    ASSERT_TRUE(r.valid);
    counts[r.num_accepted * V + tokens[r.num_accepted]] += 1;
  }
  double chi2 = 0;
  int cells = 0;
  for (int c = 0; c < 2 * V; ++c) {
    if (expected[c] == 0) {
      EXPECT_EQ(counts[c], 0) << "impossible cell " << c;
      continue;
    }
    const double e = expected[c] * n;
    chi2 += (counts[c] - e) * (counts[c] - e) / e;
    ++cells;
  }
  ASSERT_EQ(cells, 7);
  EXPECT_LT(chi2, 22.46);
}

}  // namespace
