// specdec::verify_tree: the parameter block and the tree rules shared by the CPU
// and CUDA kernels and the host argument checks. Framework-free.
//
// A tree of N nodes per row: node 0 is the root (the last committed token, its id
// is not read), parents[0] = -1, and every other node's parent has a smaller
// index (so node indices are a topological order, e.g. BFS). target_logits[b, n]
// is the target's prediction after node n; draft_probs[b, n] the draft law q_n
// node n's children were drawn from (i.i.d.), or none (deterministic candidates,
// e.g. the draft's top-k).
//
// The walk (multi-draft speculative sampling, SpecInfer style), from the root: at
// node n with children c_1 < c_2 < ... (index order) the residual law starts as
// r = p'_n (the filtered target law, core/verify_math.h). Child c_i with token x:
//   with q_n:    accepted with probability min(1, r(x) / q_n(x)); else
//                r <- normalise(max(0, r - q_n)) (kept as it is when that is all 0,
//                which means r == q_n: the next child is then accepted);
//   without q_n: accepted with probability r(x); else r(x) <- 0, renormalised.
// The first accepted child is moved to; when none is, a token is drawn from r
// (the correction) and the walk stops; at a leaf a bonus token is drawn from
// p'_leaf. Greedy rows (T == 0): the first child whose token is the argmax is
// accepted, else the argmax is emitted. Repeated sibling tokens are handled by
// the same rules, so the emitted tokens follow the target law exactly.
//
// Random numbers (core/rng.h, the row's verify streams): the test of child c
// uses accept_uniform(rng, c - 1) and the draw at node n the race streams at
// position n, so a chain-shaped tree (parents = [-1, 0, 1, ...]) draws exactly
// the numbers of specdec::verify with the same seed and offset.
#pragma once
#include <cstdint>

#include "macros.h"
#include "sampling_params.h"

namespace specdec {

struct TreeVerifyParams {
  const void* logits = nullptr;        // [B, N, V] float32|fp16|bf16, vocab stride 1
  int64_t logits_stride_b = 0, logits_stride_n = 0;
  const void* draft_probs = nullptr;   // [B, N, V] float32|fp16|bf16, or nullptr (deterministic children)
  int64_t probs_stride_b = 0, probs_stride_n = 0;
  const int64_t* token_ids = nullptr;  // [B, N] contiguous (node 0's entry not read)
  const int64_t* parents = nullptr;    // [N] (parents_stride_b = 0) or [B, N], rows contiguous
  int64_t parents_stride_b = 0;
  int64_t B = 0, N = 0, V = 0;
  int64_t depth = 0;                   // D: the outputs hold D + 1 entries per row
  ScalarOrRow<float> temperature;      // per row; 0 = greedy
  RowRandomness rnd;
  RowFilters filters;
  int64_t* tokens = nullptr;           // [B, D+1] out
  int64_t* path = nullptr;             // [B, D+1] out
  int64_t* num_accepted = nullptr;     // [B] out
  bool* valid = nullptr;               // [B] out
  SPECDEC_HD const int64_t* parents_of(int64_t b) const { return parents + b * parents_stride_b; }
};

// Node n's parent entry is well formed: -1 for the root, in [0, n) otherwise.
SPECDEC_HD bool valid_parent(const int64_t* parents, int64_t n) {
  return n == 0 ? parents[0] == -1 : parents[n] >= 0 && parents[n] < n;
}

// The depth of node n (root 0) in a tree whose parent entries up to n are well formed.
SPECDEC_HD int64_t node_depth(const int64_t* parents, int64_t n) {
  int64_t d = 0;
  for (; n > 0; n = parents[n]) ++d;
  return d;
}

// The first child of `node` after node `after` (children in index order), or -1.
SPECDEC_HD int64_t next_child(const int64_t* parents, int64_t N, int64_t node, int64_t after) {
  for (int64_t c = after + 1; c < N; ++c)
    if (parents[c] == node) return c;
  return -1;
}

// The tests of the walk, division-free. r = w / Z is the residual law (w >= 0,
// Z = sum w > 0); q_x = 1 stands for a deterministic child.
//   first child of a node (r = p' = e / s): ratio_test_accepts (core/verify_math.h)
//   later children:                          u * q_x * Z < w(x)
SPECDEC_HD bool residual_test_accepts(float u, float q_x, float Z, float w_x) { return u * q_x * Z < w_x; }

// The accept uniform of child c (c >= 1): position c - 1 of the verify stream.
SPECDEC_HD uint32_t child_position(int64_t c) { return static_cast<uint32_t>(c - 1); }

}  // namespace specdec
