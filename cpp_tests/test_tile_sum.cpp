// core/tile_sum.h: the streamed pairwise sum equals its recursive definition, and a row cut
// into contiguous shards at tile boundaries gives the single-device sum bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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
