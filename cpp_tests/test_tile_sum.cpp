// core/tile_sum.h: the streamed pairwise sum equals its recursive definition, and a row cut
// into contiguous shards at tile boundaries gives the single-device sum bit for bit; the same
// for the CUDA kernels' tree of (max, sum) pairs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/shard_math.h"
#include "core/tile_sum.h"

using namespace specdec;

namespace {
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Tile values over many binades, so that the order of the additions shows in the bits.
std::vector<float> tile_values(int64_t T, std::mt19937& gen) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 10);
  std::vector<float> s(static_cast<size_t>(T));
  for (auto& x : s) x = std::ldexp(mant(gen), expo(gen));
  return s;
}

// The definition of tile_sum.h, written recursively: node(L, j), then the fold of the
// complete blocks (one per set bit of T, largest first) from the right.
float node(const std::vector<float>& s, int L, int64_t j) {
  if (L == 0) return s[static_cast<size_t>(j)];
  return node(s, L - 1, 2 * j) + node(s, L - 1, 2 * j + 1);
}
float defined_sum(const std::vector<float>& s) {
  const int64_t T = static_cast<int64_t>(s.size());
  std::vector<float> blocks;
  int64_t p = 0;
  for (int L = 62; L >= 0; --L)
    if ((T >> L) & 1) {
      blocks.push_back(node(s, L, p >> L));
      p += int64_t(1) << L;
    }
  if (blocks.empty()) return 0.0f;
  float acc = blocks.back();
  for (int i = static_cast<int>(blocks.size()) - 2; i >= 0; --i) acc = blocks[static_cast<size_t>(i)] + acc;
  return acc;
}

float streamed_sum(const std::vector<float>& s) {
  TileSumStack st;
  for (float x : s) st.add(x);
  return st.total();
}

// Shards [cuts[r], cuts[r+1]): each streams its own tiles from its first one; their
// stacks (the covers) are then added in order into one stack from tile 0.
float sharded_sum(const std::vector<float>& s, const std::vector<int64_t>& cuts) {
  TileSumStack all;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) {
    TileSumStack shard(cuts[r]);
    for (int64_t t = cuts[r]; t < cuts[r + 1]; ++t) shard.add(s[static_cast<size_t>(t)]);
    EXPECT_EQ(shard.depth, tile_cover_size(cuts[r], cuts[r + 1]));
    int64_t p = cuts[r];
    for (int i = 0; i < shard.depth; ++i) {  // the stack is the cover, block by block
      const int L = tile_cover_level(p, cuts[r + 1]);
      EXPECT_EQ(shard.level[i], L) << "shard " << r << " block " << i;
      all.add_block(shard.value[i], shard.level[i]);
      p += int64_t(1) << L;
    }
    EXPECT_EQ(p, cuts[r + 1]);
  }
  return all.total();
}

float left_to_right(const std::vector<float>& s, int64_t a, int64_t b) {
  float acc = 0.0f;
  for (int64_t t = a; t < b; ++t) acc += s[static_cast<size_t>(t)];
  return acc;
}
}  // namespace

TEST(TileSum, StreamedSumIsThePairwiseTreeOfItsDefinition) {
  std::mt19937 gen(1);
  for (int64_t T = 0; T <= 300; ++T) {
    const auto s = tile_values(T, gen);
    EXPECT_EQ(bits(streamed_sum(s)), bits(defined_sum(s))) << "T=" << T;
  }
  const auto s = tile_values(1002, gen);  // V = 128256 in tiles of 128
  EXPECT_EQ(bits(streamed_sum(s)), bits(defined_sum(s)));
}

TEST(TileSum, ShardsAtTileBoundariesGiveTheSameBits) {
  std::mt19937 gen(2);
  int order_mattered = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t T = std::uniform_int_distribution<int64_t>(1, 1100)(gen);
    const int P = std::uniform_int_distribution<int>(2, 6)(gen);
    std::vector<int64_t> cuts = {0, T};
    for (int r = 1; r < P; ++r) cuts.push_back(std::uniform_int_distribution<int64_t>(0, T)(gen));  // uneven, maybe empty
    std::sort(cuts.begin(), cuts.end());
    const auto s = tile_values(T, gen);
    ASSERT_EQ(bits(sharded_sum(s, cuts)), bits(streamed_sum(s))) << "trial " << trial << " T=" << T;
    // the same shards summed left to right, then added: not the single-device bits in general
    float naive = 0.0f;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) naive += left_to_right(s, cuts[r], cuts[r + 1]);
    order_mattered += bits(naive) != bits(left_to_right(s, 0, T));
  }
  EXPECT_GT(order_mattered, 500);  // the values do expose the order of the additions
}

TEST(TileSum, EvenShardsOfAPowerOfTwoAndEmptyShards) {
  std::mt19937 gen(3);
  const auto s = tile_values(1024, gen);
  for (int P : {2, 4, 8}) {
    std::vector<int64_t> cuts;
    for (int r = 0; r <= P; ++r) cuts.push_back(1024 / P * r);
    EXPECT_EQ(bits(sharded_sum(s, cuts)), bits(streamed_sum(s))) << P;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) EXPECT_EQ(tile_cover_size(cuts[r], cuts[r + 1]), 1);
  }
  EXPECT_EQ(bits(sharded_sum(s, {0, 0, 500, 500, 1024, 1024})), bits(streamed_sum(s)));
  EXPECT_EQ(tile_cover_size(7, 7), 0);
  EXPECT_EQ(TileSumStack().total(), 0.0f);
}

TEST(TileSum, CoverSizeIsLogarithmic) {
  for (int64_t a = 0; a < 600; a += 7)
    for (int64_t b = a + 1; b < 1300; b += 13) {
      const int n = tile_cover_size(a, b);
      EXPECT_LE(n, 2 * static_cast<int>(std::log2(static_cast<double>(b - a))) + 2) << a << " " << b;
    }
  EXPECT_LE(tile_cover_size(1, (int64_t(1) << 40) - 1), 2 * 40);
}

// ---- the CUDA kernels' tree of (max, sum) pairs (cuda/tile_stats.cuh) ----

namespace {
// Random pairs as tiles give them: a max over many binades (some tied, some empty tiles)
// and a sum in [1, 128] (the max token's e is 1).
std::vector<SoftmaxStats> tile_pairs(int64_t T, std::mt19937& gen) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f), sum(1.0f, 128.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<SoftmaxStats> s(static_cast<size_t>(T));
  float last = 0.0f;
  for (auto& p : s) {
    const int k = kind(gen);
    if (k == 0) p = stats_empty();                             // a tile of -inf / filtered tokens
    else if (k == 1) p = SoftmaxStats{last, sum(gen)};         // a max tied with the previous one
    else p = SoftmaxStats{last = std::ldexp(mant(gen), std::uniform_int_distribution<int>(-3, 5)(gen)) *
                                 (k % 2 ? 1.0f : -1.0f), sum(gen)};
  }
  return s;
}
bool same(SoftmaxStats a, SoftmaxStats b) { return bits(a.max) == bits(b.max) && bits(a.sum) == bits(b.sum); }

// The full dyadic tree over n items (a power of two), as the warp butterfly computes it.
SoftmaxStats padded_tree(std::vector<SoftmaxStats> v, float inv_t) {
  for (size_t w = v.size(); w > 1; w /= 2)
    for (size_t i = 0; i < w / 2; ++i) v[i] = stats_merge(v[2 * i], v[2 * i + 1], inv_t);
  return v[0];
}
}  // namespace

// What lets a warp compute the tree: stats_merge commutes bit for bit (the butterfly's right
// lane merges (right, left)) and (-inf, 0) is an exact identity, so the stack's tree over T
// tiles is the full tree over the next power of two with the missing tiles empty.
TEST(PairTree, MergeCommutesAndTheEmptyPairIsAnIdentity) {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<SoftmaxStats> p = tile_pairs(64, gen);
    const float inv_t = trial % 2 ? 1.0f : 0.7f;
    for (size_t i = 0; i + 1 < p.size(); ++i) {
      ASSERT_TRUE(same(stats_merge(p[i], p[i + 1], inv_t), stats_merge(p[i + 1], p[i], inv_t)));
      ASSERT_TRUE(same(stats_merge(p[i], stats_empty(), inv_t), p[i]) || p[i].max == -INFINITY);
      ASSERT_TRUE(same(stats_merge(stats_empty(), p[i], inv_t), p[i]) || p[i].max == -INFINITY);
    }
  }
}

TEST(PairTree, StackIsThePaddedTree) {
  std::mt19937 gen(12);
  for (int64_t T = 1; T <= 300; T += (T < 40 ? 1 : 23)) {
    const std::vector<SoftmaxStats> p = tile_pairs(T, gen);
    const float inv_t = 1.3f;
    TileTreeStack<SoftmaxStats, PairMerge> st(0, PairMerge{inv_t});
    for (const auto& x : p) st.add(x);
    size_t n = 1;
    while (n < p.size()) n *= 2;
    std::vector<SoftmaxStats> padded = p;
    padded.resize(n, stats_empty());
    EXPECT_TRUE(same(st.total(), padded_tree(padded, inv_t))) << "T = " << T;
  }
}

// The CUDA protocol (ShardPlan::pairs): each shard sends the (max, sum) cover of its parts;
// combine_sum folds them into the tree of the whole row: the single-device sum, bit for bit,
// whatever the split. On a huge row (a shard's kMax flag) it folds the plain sums instead.
TEST(PairTree, ShardCoversGiveTheWholeRowSum) {
  std::mt19937 gen(13);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t V = std::uniform_int_distribution<int64_t>(1, 6000)(gen);
    const int P = std::uniform_int_distribution<int>(1, 5)(gen);
    std::vector<int64_t> b{0};
    for (int r = 1; r < P; ++r) {
      const int64_t c = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, V - 1))(gen);
      if (c > b.back() && c < V) b.push_back(trial % 2 ? c / 128 * 128 : c);
      if (b.back() == 0 || (b.size() > 1 && b[b.size() - 2] == b.back())) b.pop_back();
    }
    b.push_back(V);
    const ShardLayout L{b.data(), static_cast<int64_t>(b.size()) - 1};
    const int64_t parts = L.first_part(L.P - 1) + L.part_count(L.P - 1);
    const std::vector<SoftmaxStats> p = tile_pairs(parts, gen);
    const float inv_t = 0.9f;
    const bool huge = trial % 7 == 0;
    TileTreeStack<SoftmaxStats, PairMerge> whole(0, PairMerge{inv_t});
    TileSumStack whole_sum;
    for (const auto& x : p) {
      whole.add(x);
      whole_sum.add(x.sum);
    }
    ShardGathered g;
    g.plan = ShardPlan::of(false, false, false, /*pairs=*/true);
    g.K = 0;
    const int64_t W = shard_step_width(ShardStep::kSums, L, true);
    g.width[0] = shard_step_width(ShardStep::kMax, L, true);
    g.width[g.plan.sums()] = W;
    std::vector<std::vector<double>> maxes, sums;
    for (int64_t r = 0; r < L.P; ++r) {
      maxes.push_back({0.0, 0.0, huge && r == L.P - 1 ? 1.0 : 0.0});
      TileTreeStack<SoftmaxStats, PairMerge> s(L.first_part(r), PairMerge{inv_t});
      TileSumStack plain(L.first_part(r));
      for (int64_t q = L.first_part(r); q < L.first_part(r) + L.part_count(r); ++q) {
        s.add(p[static_cast<size_t>(q)]);
        plain.add(p[static_cast<size_t>(q)].sum);
      }
      ASSERT_EQ(s.depth, L.cover_size(r));
      ASSERT_LE(2 * s.depth + 2, W);
      sums.emplace_back(static_cast<size_t>(W), 0.0);
      for (int d = 0; d < s.depth; ++d) {
        sums.back()[2 * d] = huge ? 0.0 : s.value[d].max;
        sums.back()[2 * d + 1] = huge ? plain.value[d] : s.value[d].sum;
      }
    }
    std::vector<const void*> mp, sp;
    for (auto& v : maxes) mp.push_back(v.data());
    for (auto& v : sums) sp.push_back(v.data());
    g.step[0] = mp.data();
    g.step[g.plan.sums()] = sp.data();
    const float got = combine_sum(g, L, 0, 0, inv_t);
    EXPECT_EQ(bits(got), bits(huge ? whole_sum.total() : whole.total().sum)) << "trial " << trial << ", P " << L.P;
  }
}
