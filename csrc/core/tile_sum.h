// The canonical order in which a row's per-tile partial sums are added up: a pairwise
// (dyadic) tree over tile indices. The point of a fixed tree is that a row split into
// contiguous vocabulary shards at tile boundaries gives a BIT-IDENTICAL sum: each shard
// adds up the tree nodes that lie inside it, and whoever combines the shards adds those
// nodes in the same tree. A left-to-right sum, or one accumulator per SIMD lane / thread,
// cannot be split that way (float addition is not associative), and the verify test
// (u * q * s < e) and the residual (e / s - q) both read the row sum s, so the same tokens
// on P devices as on one need the same s.
//
// Definitions, for tile values s_0 .. s_{T-1} (tile t = the tokens [t * tile, (t+1) * tile)):
//   node(0, j) = s_j;  node(L, j) = node(L-1, 2j) + node(L-1, 2j+1) for the blocks
//   [j 2^L, (j+1) 2^L) that lie inside [0, T);
//   sum = B_1 + (B_2 + (... + B_n)), where B_1 .. B_n are the complete blocks left over, one
//   per set bit of T, largest (leftmost) first.
// TileSumStack adds tiles (or whole aligned blocks of tiles) in index order and keeps the
// unfinished blocks on a stack, merging two siblings as soon as the right one is complete.
// Started at tile a and fed the tiles [a, b), its stack holds exactly the blocks of the
// cover of [a, b) (tile_cover_level): what a shard sends. Fed those covers, shard after
// shard from tile 0, it rebuilds the same nodes and so the same sum.
#pragma once

#include <stdint.h>

#include "core/macros.h"

namespace specdec {

// The level L of the first block of the cover of the tiles [p, end), p < end: the largest
// L with p a multiple of 2^L and p + 2^L <= end (a maximal aligned block).
SPECDEC_HD int tile_cover_level(int64_t p, int64_t end) {
  int L = 0;
  while (L < 62 && ((p >> L) & 1) == 0 && p + (int64_t(2) << L) <= end) ++L;
  return L;
}

// The number of blocks in the cover of the tiles [a, b) (0 when a >= b): at most
// 2 * log2(b - a) + 2, what a shard of b - a tiles sends per row.
SPECDEC_HD int tile_cover_size(int64_t a, int64_t b) {
  int n = 0;
  for (int64_t p = a; p < b; p += int64_t(1) << tile_cover_level(p, b)) ++n;
  return n;
}

// The tree over any value with a merge `merge(left, right)` and an identity `Merge::empty()`:
// floats under + (TileSumStack), or (max, sum) softmax pairs under stats_merge (the CUDA
// kernels' canonical per-tile stats, cuda/sampling_kernels.cuh). An identity that merges
// EXACTLY (x + 0.0f == x; stats_merge(x, empty) == x bit for bit) makes the tree over T tiles
// equal to the full tree over the next power of two with the missing tiles empty: that is
// how a warp reduces it (cuda: merge_stat_blocks).
template <typename Value, typename Merge>
struct TileTreeStack {
  static constexpr int kCapacity = 128;  // > 2 * 62 levels: any cover of any tile range

  int64_t next;  // the first tile not added yet
  int depth = 0;
  Merge merge;
  int8_t level[kCapacity];
  Value value[kCapacity];

  SPECDEC_HD explicit TileTreeStack(int64_t first_tile = 0, Merge m = Merge{}) : next(first_tile), merge(m) {}

  // One tile's value (tile `next`).
  SPECDEC_HD void add(Value s) { add_block(s, 0); }

  // A whole block of 2^L tiles starting at tile `next`, whose value is that block's node
  // (`next` must be a multiple of 2^L). A block completes its left sibling when the two
  // together are aligned to 2^(L+1): they merge as left + right, then the same one level up.
  SPECDEC_HD void add_block(Value s, int L) {
    next += int64_t(1) << L;
    while (depth > 0 && level[depth - 1] == L && (next & ((int64_t(2) << L) - 1)) == 0) {
      s = merge(value[--depth], s);
      ++L;
    }
    level[depth] = static_cast<int8_t>(L);
    value[depth++] = s;
  }

  // The value of every tile added since tile 0: the blocks left on the stack, folded from the
  // right. (Meaningful for a stack started at tile 0; a shard's stack is its cover instead.)
  SPECDEC_HD Value total() const {
    if (depth == 0) return Merge::empty();
    Value s = value[depth - 1];
    for (int i = depth - 2; i >= 0; --i) s = merge(value[i], s);
    return s;
  }
};

struct FloatAdd {
  SPECDEC_HD float operator()(float a, float b) const { return a + b; }
  SPECDEC_HD static float empty() { return 0.0f; }
};

using TileSumStack = TileTreeStack<float, FloatAdd>;

}  // namespace specdec
