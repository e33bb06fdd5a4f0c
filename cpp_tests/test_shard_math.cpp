// core/shard_math.h: the layout of a vocabulary split into shards, and the combination of the
// shards' step outputs (max, tile-sum covers, filter histograms, races) into what one device
// computes on the whole row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/filter_math.h"
#include "core/shard_math.h"

using namespace specdec;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Random shard bounds of a V-token vocabulary: P shards, cut anywhere (aligned = at tiles).
std::vector<int64_t> random_bounds(int64_t V, int P, bool aligned, std::mt19937& gen) {
  std::vector<int64_t> b{0};
  for (int r = 1; r < P; ++r) {
    const int64_t lo = b.back() + 1, hi = V - (P - r);
    if (lo > hi) break;
    int64_t x = std::uniform_int_distribution<int64_t>(lo, hi)(gen);
    if (aligned) x = (x / kRaceTile) * kRaceTile;
    if (x > b.back() && x < V) b.push_back(x);
  }
  b.push_back(V);
  return b;
}

// The P step outputs of one step as ShardGathered wants them: [P] pointers.
struct Gathered {
  std::vector<std::vector<double>> f;
  std::vector<std::vector<int64_t>> i;
  std::vector<const void*> ptrs;
};

}  // namespace

TEST(ShardLayout, PartsAreTilesCutAtTheBounds) {
  std::mt19937 gen(1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = std::uniform_int_distribution<int64_t>(1, 3000)(gen);
    const int P = std::uniform_int_distribution<int>(1, 5)(gen);
    const std::vector<int64_t> b = random_bounds(V, P, trial % 2 == 0, gen);
    const ShardLayout L{b.data(), static_cast<int64_t>(b.size()) - 1};
    int64_t parts = 0;
    for (int64_t r = 0; r < L.P; ++r) {
      EXPECT_EQ(L.first_part(r), parts);
      int64_t n = 0;
      for (int64_t v = L.start(r); v < L.end(r); v = part_end(v, L.end(r))) {
        EXPECT_EQ(v / kRaceTile, (part_end(v, L.end(r)) - 1) / kRaceTile);  // inside one tile
        ++n;
      }
      EXPECT_EQ(n, L.part_count(r));
      parts += n;
      for (int64_t v : {L.start(r), L.end(r) - 1}) EXPECT_EQ(L.owner(v), r);
    }
    int64_t cuts = 0;  // every bound inside a tile splits one more part off
    for (size_t k = 1; k + 1 < b.size(); ++k) cuts += b[k] % kRaceTile != 0;
    EXPECT_EQ(parts, (V + kRaceTile - 1) / kRaceTile + cuts);
  }
}

TEST(ShardCombine, CoversFoldToTheWholeRowSum) {
  std::mt19937 gen(2);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = std::uniform_int_distribution<int64_t>(1, 5000)(gen);
    const std::vector<int64_t> b = random_bounds(V, std::uniform_int_distribution<int>(1, 6)(gen), trial % 3 != 0, gen);
    const ShardLayout L{b.data(), static_cast<int64_t>(b.size()) - 1};
    const int64_t total_parts = L.first_part(L.P - 1) + L.part_count(L.P - 1);
    std::vector<float> part_value(static_cast<size_t>(total_parts));
    for (auto& x : part_value) x = std::ldexp(mant(gen), expo(gen));
    TileSumStack whole;
    for (float x : part_value) whole.add(x);
    // each shard's cover (its stack started at its first part), in the kSums layout
    const int64_t W = shard_step_width(ShardStep::kSums, L);
    ShardGathered g;
    g.plan = ShardPlan::of(false, false, false);
    g.K = 0;
    Gathered sums;
    for (int64_t r = 0; r < L.P; ++r) {
      TileSumStack s(L.first_part(r));
      for (int64_t p = L.first_part(r); p < L.first_part(r) + L.part_count(r); ++p) s.add(part_value[p]);
      ASSERT_EQ(s.depth, L.cover_size(r));
      ASSERT_LE(s.depth + 2, W);
      sums.f.emplace_back(static_cast<size_t>(W), 0.0);
      for (int d = 0; d < s.depth; ++d) sums.f.back()[d] = s.value[d];
    }
    for (auto& v : sums.f) sums.ptrs.push_back(v.data());
    g.step[g.plan.sums()] = sums.ptrs.data();
    g.width[g.plan.sums()] = W;
    const float got = combine_sum(g, L, 0, 0);
    uint32_t a, c;
    const float want = whole.total();
    std::memcpy(&a, &got, 4);
    std::memcpy(&c, &want, 4);
    EXPECT_EQ(a, c) << "trial " << trial << ", P " << L.P;
  }
}

TEST(ShardCombine, MaxKeepsNaNAndTheFirstArgmax) {
  const std::vector<int64_t> b{0, 128, 256, 384};
  const ShardLayout L{b.data(), 3};
  ShardGathered g;
  g.plan = ShardPlan::of(false, false, false);
  g.width[0] = 2;
  auto run = [&](std::vector<std::vector<double>> per_rank, float& m, int64_t& arg) {
    std::vector<const void*> ptrs;
    for (auto& v : per_rank) ptrs.push_back(v.data());
    g.step[0] = ptrs.data();
    combine_max(g, L, 0, 0, m, arg);
  };
  float m;
  int64_t arg;
  run({{1.0, 5}, {3.0, 140}, {3.0, 300}}, m, arg);  // a tie: the lower shard's (first) argmax
  EXPECT_EQ(m, 3.0f);
  EXPECT_EQ(arg, 140);
  run({{-kInf, 0}, {-kInf, 128}, {-kInf, 256}}, m, arg);
  EXPECT_EQ(m, -kInf);
  run({{1.0, 5}, {std::nan(""), 0}, {9.0, 300}}, m, arg);
  EXPECT_TRUE(std::isnan(m));
}

TEST(ShardCombine, RaceTakesTheBestKeyTiesToTheLowerPartAndFallsBackToP) {
  const std::vector<int64_t> b{0, 128, 256};
  const ShardLayout L{b.data(), 2};
  ShardGathered g;
  g.plan = ShardPlan::of(false, false, false);
  g.width[g.plan.races()] = 7;
  auto run = [&](ShardRace r0, ShardRace r1, bool& bad) {
    std::vector<std::vector<double>> v(2, std::vector<double>(7));
    store_race(v[0].data(), r0);
    store_race(v[1].data(), r1);
    std::vector<const void*> ptrs{v[0].data(), v[1].data()};
    g.step[g.plan.races()] = ptrs.data();
    return combine_race(g, L, 0, 0, bad);
  };
  bool bad;
  EXPECT_EQ(run({2.0f, 0, 7, 1.0f, 0, 8, false}, {3.0f, 128, 140, 9.0f, 128, 150, false}, bad), 140);
  EXPECT_EQ(run({3.0f, 0, 7, 1.0f, 0, 8, false}, {3.0f, 128, 140, 9.0f, 128, 150, false}, bad), 7);  // tie
  EXPECT_EQ(run({0.0f, 0, 7, 1.0f, 0, 8, false}, {0.0f, 128, 140, 9.0f, 128, 150, false}, bad), 150);  // w all 0
  EXPECT_FALSE(bad);
  run(shard_race_empty(), {1.0f, 128, 140, 1.0f, 128, 150, true}, bad);
  EXPECT_TRUE(bad);
  EXPECT_EQ(run(shard_race_empty(), {1.0f, 128, 140, 1.0f, 128, 150, false}, bad), 140);  // an empty shard
}

// The filter steps: each shard's histograms of core/filter_math.h's reference passes, summed
// by replay_cut, give filter_cutoff_reference's cutoff on the whole row, whatever the split.
TEST(ShardCombine, FilterPassesGiveTheWholeRowCutoff) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t V = std::uniform_int_distribution<int64_t>(2, 2000)(gen);
    std::vector<float> row(static_cast<size_t>(V));
    for (auto& x : row) x = std::round(normal(gen) * 4.0f) / 4.0f;  // ties at the cutoffs
    float m = -kInf;
    for (float x : row) m = x > m ? x : m;
    const float inv_t = trial % 2 ? 1.0f : 1.5f;
    FilterSpec f;
    f.top_k = trial % 4 == 3 ? 0 : std::uniform_int_distribution<int64_t>(1, V + 1)(gen);
    f.top_p = trial % 3 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(gen);
    f.min_p = trial % 5 == 0 ? 0.0f : std::uniform_real_distribution<float>(0.0f, 0.5f)(gen);
    const float want = filter_cutoff_reference(row.data(), V, m, inv_t, f);
    const std::vector<int64_t> b = random_bounds(V, std::uniform_int_distribution<int>(1, 5)(gen), false, gen);
    const ShardLayout L{b.data(), static_cast<int64_t>(b.size()) - 1};
    ShardGathered g;
    g.plan = ShardPlan::of(true, true, true);
    std::vector<Gathered> steps(static_cast<size_t>(g.plan.n));
    for (int s = 1; s < g.plan.sums(); ++s) {  // each filter step: every shard's pass, given the ones before
      const ShardStep kind = g.plan.kind[s];
      g.width[s] = shard_step_width(kind, L);
      const ShardCutSearch c = replay_cut(g, L, 0, 0, f, s);
      for (int64_t r = 0; r < L.P; ++r) {
        std::vector<int64_t> h(static_cast<size_t>(g.width[s]), 0);
        float lo = m;
        for (int64_t v = L.start(r); v < L.end(r); ++v) {
          const float x = row[v];
          const uint32_t key = order_key(x);
          if (kind == ShardStep::kTopK && c.topk.in_bucket(key)) ++h[c.topk.digit(key)];
          if (kind == ShardStep::kTopP && x >= c.topk_cut && c.topp.in_bucket(key)) {
            ++h[c.topp.digit(key)];
            h[kRadixBins + c.topp.digit(key)] += static_cast<int64_t>(fixed_mass(shifted_exp(x, m, inv_t)));
          }
          if (kind == ShardStep::kMinP && x < lo && shifted_exp(x, m, inv_t) >= f.min_p) lo = x;
        }
        if (kind == ShardStep::kMinP) h[0] = order_key(lo);
        steps[s].i.push_back(std::move(h));
      }
      for (auto& v : steps[s].i) steps[s].ptrs.push_back(v.data());
      g.step[s] = steps[s].ptrs.data();
    }
    const float got = replay_cut(g, L, 0, 0, f, g.plan.sums()).cut;
    // as a cutoff: the same survivors (-0 and +0 cut alike)
    for (float x : row) ASSERT_EQ(x >= got, x >= want) << "trial " << trial << " x " << x;
  }
}
