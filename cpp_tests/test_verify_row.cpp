// The per-row algorithm on raw arrays (core/verify_math.h): merges, ratio test,
// race, and the scalar reference of one verify row, including a chi-square check
// of its output law.
#include <gtest/gtest.h>

#include <algorithm>
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

// ---- The helpers the kernels and verify_row_reference share, on their own ---------------------
// test_native_reference compares the kernels with the scalar reference, which calls the same
// shifted_exp, ratio_test_accepts, residual_weight, race and exponential helpers: a bug in one of
// them is invisible there. Each is checked here against a float64 formula written out below
// (issue 35 item 10), at tolerances from float32 rounding of its inputs' operations.

// 2^-23 (float32's unit roundoff is half of it)
constexpr double kEps = 1.0 / 8388608.0;

TEST(SharedHelpers, ShiftedExpIsExpOfTheScaledGap) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> logit(-30.0f, 30.0f), log10_t(-3.0f, 3.0f);
  for (int i = 0; i < 200000; ++i) {
    const float a = logit(gen), b = logit(gen), x = std::min(a, b), m = std::max(a, b);
    const float inv_t = 1.0f / std::pow(10.0f, log10_t(gen));  // T in [1e-3, 1e3]
    const double arg = (double(x) - double(m)) * double(inv_t);
    const double want = std::exp(arg);
    // (x - m) and the product each round once (relative kEps / 2), exp once more; 2e-45: the
    // denormal float32 range's absolute rounding
    const double tol = want * kEps * (2.0 + 2.0 * std::abs(arg)) + 2e-45;
    ASSERT_NEAR(shifted_exp(x, m, inv_t), want, tol) << "x=" << x << " m=" << m << " inv_t=" << inv_t;
    ASSERT_EQ(shifted_exp(m, m, inv_t), 1.0f);
  }
}

// The ratio test accepts draft x with probability min(1, p(x) / q(x)), p(x) = e / s: over an
// even grid of N uniforms (u_k = (k + 0.5) / N, as uniform_open01 makes them for N = 2^23) the
// accepted fraction is that probability to within 1 / N, and each decision is the float64
// comparison u < p / q away from the boundary.
TEST(SharedHelpers, RatioTestAcceptsWithProbabilityMinOfOneAndPOverQ) {
  std::mt19937 gen(2);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f), sum(1.0f, 50.0f);
  const int N = 4096;
  for (int c = 0; c < 2000; ++c) {
    const float e = unit(gen), s = sum(gen), q = c % 10 == 0 ? 1.0f : std::max(unit(gen), 1e-6f);
    const double ratio = (double(e) / double(s)) / double(q);
    int accepted = 0;
    for (int k = 0; k < N; ++k) {
      const float u = float((k + 0.5) / N);
      const bool got = ratio_test_accepts(u, q, s, e);
      accepted += got;
      if (std::abs(double(u) - ratio) > 4 * kEps * std::max(ratio, double(u))) {
        ASSERT_EQ(got, double(u) < ratio) << "u=" << u << " q=" << q << " s=" << s << " e=" << e;
      }
    }
    ASSERT_NEAR(double(accepted) / N, std::min(1.0, ratio), 2.0 / N) << "q=" << q << " s=" << s << " e=" << e;
  }
  EXPECT_FALSE(ratio_test_accepts(uniform_open01(0u), 1.0f, 1.0f, 0.0f));  // p = 0: never
  EXPECT_TRUE(ratio_test_accepts(uniform_open01(~0u), 0.25f, 2.0f, 0.5f));  // p == q: always
}

// The residual law max(0, p - q) / sum of one row, p = softmax(logits / T) from shifted_exp
// and the row's sum, against float64 throughout; and the weighted form of block verification.
TEST(SharedHelpers, ResidualWeightIsThePositivePartOfPMinusQ) {
  std::mt19937 gen(3);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f), scale(0.0f, 3.0f);
  const int V = 9;
  for (int c = 0; c < 20000; ++c) {
    float x[V], q[V];
    double ex[V], qsum = 0, es = 0;
    float m = -kInf;
    for (int v = 0; v < V; ++v) x[v] = logit(gen), q[v] = unit(gen), m = std::max(m, x[v]), qsum += q[v];
    for (int v = 0; v < V; ++v) q[v] = float(q[v] / qsum), ex[v] = std::exp(double(x[v]) - double(m)), es += ex[v];
    float e[V], s = 0.0f;
    for (int v = 0; v < V; ++v) e[v] = shifted_exp(x[v], m, 1.0f), s += e[v];
    const float inv_s = 1.0f / s, sc = scale(gen);
    double want[V], got[V], wz = 0, gz = 0;
    for (int v = 0; v < V; ++v) {
      const double p = ex[v] / es;
      want[v] = std::max(0.0, p - double(q[v]));
      got[v] = residual_weight(e[v], inv_s, q[v]);
      // e (relative (1 + |x - m| / 2) kEps), s (V additions), 1 / s and the product round, the
      // difference once more: (2 V + 16) kEps of p + q bounds them for these logits
      ASSERT_NEAR(got[v], want[v], (2 * V + 16) * kEps * (p + q[v])) << "v=" << v;
      const double w_scaled = std::max(0.0, double(sc) * p - double(q[v]));
      ASSERT_NEAR(scaled_residual_weight(e[v], inv_s, sc, q[v]), w_scaled, (2 * V + 17) * kEps * (sc * p + q[v]));
      ASSERT_EQ(scaled_residual_weight(e[v], inv_s, 1.0f, q[v]), residual_weight(e[v], inv_s, q[v]));
      wz += want[v], gz += got[v];
    }
    for (int v = 0; v < V && wz > 0.05; ++v) ASSERT_NEAR(got[v] / gz, want[v] / wz, 1e-3) << "residual law, v=" << v;
  }
}

// Exp(1) from 23 bits: each of the 2^23 values is -log((k + 0.5) / 2^23) (float64), so over all
// of them the exponential has mean 1 and P(E > x) = exp(-x) to within the grid's 2^-23.
TEST(SharedHelpers, RaceExponentialsAreExpOneOnTheUniformGrid) {
  const uint32_t n = 1u << 23;
  const double xs[] = {0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0};
  double mean = 0.0, above[7] = {};
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t bits = (k << 9) | (k * 2654435761u >> 23);  // the low 9 bits are ignored
    const double u = (double(k) + 0.5) / n;
    ASSERT_EQ(uniform_open01(bits), float(u));
    const float E = exponential_from_bits(bits);
    ASSERT_NEAR(E, -std::log(u), 2 * kEps * -std::log(u) + 1e-20) << "k=" << k;
    mean += E;
    for (int i = 0; i < 7; ++i) above[i] += E > xs[i];
  }
  EXPECT_NEAR(mean / n, 1.0, 1e-5);
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(above[i] / n, std::exp(-xs[i]), 2.0 / n) << "x=" << xs[i];
}

// race_better / race_merge keep the highest key, ties to the lowest index, whatever the order
// of the candidates and of the merges: against a plain scan written here.
TEST(SharedHelpers, RaceMergeKeepsTheHighestKeyLowestIndexInAnyOrder) {
  std::mt19937 gen(4);
  for (int c = 0; c < 5000; ++c) {
    const int n = 1 + int(gen() % 40);
    std::vector<RaceBest> entries(n);
    for (int i = 0; i < n; ++i) entries[i] = RaceBest{float(gen() % 6) * 0.5f, int64_t(gen() % 1000)};
    std::shuffle(entries.begin(), entries.end(), gen);
    RaceBest scan = race_empty();
    for (const RaceBest& r : entries)
      if (race_better(r.key, r.index, scan)) scan = r;
    std::vector<RaceBest> level = entries;  // a merge tree, as the blocks' reductions build it
    while (level.size() > 1) {
      std::vector<RaceBest> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(race_merge(level[i + 1], level[i]));
      if (level.size() % 2) next.push_back(race_merge(level.back(), race_empty()));
      level = next;
    }
    std::vector<RaceBest> sorted = entries;
    std::sort(sorted.begin(), sorted.end(), [](const RaceBest& a, const RaceBest& b) {
      return a.key > b.key || (a.key == b.key && a.index < b.index);
    });
    for (const RaceBest& got : {scan, level[0]}) {
      ASSERT_EQ(got.key, sorted[0].key);
      ASSERT_EQ(got.index, sorted[0].index);
    }
  }
}

}  // namespace
