// The CPU kernel of skinny_linear (csrc/op_schemas.h), compiled into both instruction-set
// copies (sampling_kernels_default.cpp, sampling_kernels_avx2.cpp) inside CPU_CAPABILITY.
//
// Why: a verification pass multiplies a handful of rows (B * (K + 1)) by each weight. A small
// model's forward on a CPU then streams its weights from memory, and torch's BLAS path spends
// more per call at 2 to 17 rows than at one (a GEMV): measured in the transformers-loaded
// bundled target's forward, its 43 linears took 1.73 ms at 1 row and 2.51 / 2.53 ms at 4 / 17
// rows through F.linear, 1.52 / 1.87 / 1.91 ms through this kernel (models/cpu_linear.py).
// Here every weight element is read once per call, whatever M.
//
// Two kernels, chosen by the weight's layout (csrc/linear_args.h):
// - row-major weight [N, K] (an nn.Linear's): K-vectorised; each output (m, n) is a vector dot
//   product of x's row m with weight row n, finished by a horizontal sum, which costs more per
//   row than the multiply-adds at these sizes.
// - packed weight [N / 16, K, 16] (ops/linear.py pack_linear_weight): N-vectorised; panel p
//   holds outputs 16p .. 16p + 15 as K rows of 16, read front to back (so the weights stream
//   from memory as one sequence per panel), x[m, k] broadcast against each; no horizontal sum,
//   so a few rows cost little more than one: one pass over the bundled target's 25 weights, 2
//   threads of the 2-core EPYC VM, took 0.49 / 0.56 / 0.68 / 1.28 ms packed at 1 / 4 / 5 / 17
//   rows against 0.79 / 1.14 / 1.02 / 1.48 ms row-major (2026-12-06, commit 3486b22,
//   python -m specdec_ext.bench linear; benchmarks/RESULTS.md).
//
// Order of the arithmetic (the same for every M, tile position and thread count, so a row's
// result never depends on the other rows of the call; it depends on the layout):
// - row-major: output (m, n) is ONE vector accumulator of Vec::size() lanes, lane l summing
//   x[m, k] * w[n, k] over k = l, l + W, ... below K rounded down to W (fmadd, k ascending);
//   then the lanes in order; then the tail k (fma, ascending); then + bias[n]; then
//   + residual[m, n].
// - packed: output (m, n) is x[m, k] * w[n, k] accumulated over k ascending from 0.f (fmadd,
//   in the vector lane that holds n); then + bias[n]; then + residual[m, n].
#pragma once
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/linear_params.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {
namespace skinny {

using Vec = at::vec::Vectorized<float>;
constexpr int kLanes = Vec::size();
constexpr int kRowTile = 4;  // input rows per tile: their x chunks are reloaded from L1 per weight chunk

// The finished output (m, n) from its lane accumulator (see the file comment for the order).
inline float finish(const Vec& acc, const float* w, const float* x, int64_t k_vec, int64_t K, const float* bias,
                    int64_t n, const float* residual) {
  float lanes[kLanes];
  acc.store(lanes);
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  for (int64_t k = k_vec; k < K; ++k) s = std::fma(x[k], w[k], s);
  if (bias != nullptr) s += bias[n];
  if (residual != nullptr) s += residual[n];
  return s;
}

// Outputs n .. n + NR - 1 of rows m0 .. m0 + MR - 1: NR weight rows against MR rows of x,
// NR * MR accumulators (NR = 3, MR = 4 fills AVX2's 16 registers with the 3 weight chunks and
// one x chunk). Compile-time sizes keep every accumulator in a register.
template <int NR, int MR>
inline void tile(const SkinnyLinearParams& P, int64_t n, int64_t m0) {
  const int64_t K = P.K, k_vec = K - K % kLanes;
  const float* w[NR];
  const float* x[MR];
  for (int i = 0; i < NR; ++i) w[i] = P.weight + (n + i) * P.w_stride;
  for (int j = 0; j < MR; ++j) x[j] = P.x + (m0 + j) * P.x_stride;
  Vec acc[NR][MR];
  for (int i = 0; i < NR; ++i)
    for (int j = 0; j < MR; ++j) acc[i][j] = Vec(0.f);
  for (int64_t k = 0; k < k_vec; k += kLanes) {
    Vec wv[NR];
    for (int i = 0; i < NR; ++i) wv[i] = Vec::loadu(w[i] + k);
    for (int j = 0; j < MR; ++j) {
      const Vec xv = Vec::loadu(x[j] + k);
      for (int i = 0; i < NR; ++i) acc[i][j] = at::vec::fmadd(xv, wv[i], acc[i][j]);
    }
  }
  for (int j = 0; j < MR; ++j) {
    const int64_t m = m0 + j;
    const float* res = P.residual != nullptr ? P.residual + m * P.r_stride : nullptr;
    for (int i = 0; i < NR; ++i) P.y[m * P.N + n + i] = finish(acc[i][j], w[i], x[j], k_vec, K, P.bias, n + i, res);
  }
}

// Outputs n .. n + NR - 1 of every row, in row tiles of kRowTile (the last one shorter).
template <int NR>
inline void feature_block(const SkinnyLinearParams& P, int64_t n) {
  int64_t m0 = 0;
  for (; m0 + kRowTile <= P.M; m0 += kRowTile) tile<NR, kRowTile>(P, n, m0);
  switch (P.M - m0) {
    case 3: tile<NR, 3>(P, n, m0); break;
    case 2: tile<NR, 2>(P, n, m0); break;
    case 1: tile<NR, 1>(P, n, m0); break;
    default: break;
  }
}

constexpr int kFeatureTile = 3;

// Feature blocks [b0, b1) of kFeatureTile outputs each; the last block may be shorter.
inline void feature_blocks(const SkinnyLinearParams& P, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * kFeatureTile, left = P.N - n;
    if (left >= 3) feature_block<3>(P, n);
    else if (left == 2) feature_block<2>(P, n);
    else feature_block<1>(P, n);
  }
}

// ---- packed weight [N / kPanel, K, kPanel]: N-vectorised ----

constexpr int kPanel = kSkinnyPanel;          // outputs per panel (core/linear_params.h)
constexpr int kPerPanel = kPanel / kLanes;  // vectors per panel row
static_assert(kPanel % kLanes == 0, "a panel row is a whole number of vectors");

// Outputs n0 .. n0 + NV * kLanes - 1 of rows m0 .. m0 + MR - 1 (n0 a multiple of kPanel, or of
// kLanes when NV < kPerPanel, so no vector straddles two panels): MR * NV
// accumulators, each weight vector loaded once per k and used by every row (x[m, k] broadcast).
// MR * NV <= 8 leaves AVX2 registers for the broadcast and the weight vectors.
template <int MR, int NV>
inline void packed_tile(const SkinnyLinearParams& P, int64_t n0, int64_t m0) {
  constexpr int NP = (NV + kPerPanel - 1) / kPerPanel;  // panels the tile spans
  const float* x[MR];
  for (int j = 0; j < MR; ++j) x[j] = P.x + (m0 + j) * P.x_stride;
  const float* panel[NP];
  for (int q = 0; q < NP; ++q) panel[q] = P.weight + (n0 / kPanel + q) * P.K * kPanel + n0 % kPanel;
  Vec acc[MR][NV];
  for (int j = 0; j < MR; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = Vec(0.f);
  for (int64_t k = 0; k < P.K; ++k) {
    Vec wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = Vec::loadu(panel[v / kPerPanel] + k * kPanel + (v % kPerPanel) * kLanes);
    for (int j = 0; j < MR; ++j) {
      const Vec xb(x[j][k]);
      for (int v = 0; v < NV; ++v) acc[j][v] = at::vec::fmadd(xb, wv[v], acc[j][v]);
    }
  }
  for (int j = 0; j < MR; ++j) {
    const int64_t m = m0 + j;
    for (int v = 0; v < NV; ++v) {
      const int64_t n = n0 + v * kLanes;
      Vec out = acc[j][v];
      if (P.bias != nullptr) out = out + Vec::loadu(P.bias + n);
      if (P.residual != nullptr) out = out + Vec::loadu(P.residual + m * P.r_stride + n);
      out.store(P.y + m * P.N + n);
    }
  }
}

// Outputs [n0, n0 + NV * kLanes) of every row, with 8 accumulators per tile where the rows
// allow (enough independent FMAs to hide their latency): rows in whole tiles of kRowTile over
// NV / 4 vectors at a time (each slice's weights reused from L1 by every row tile), then the
// M mod 4 rows left: 1 row over all NV vectors, 2 rows over NV / 2, 3 rows over NV / 4.
template <int NV>
inline void packed_columns(const SkinnyLinearParams& P, int64_t n0) {
  constexpr int kHalf = NV >= 2 ? NV / 2 : 1, kQuarter = NV >= 4 ? NV / 4 : 1;
  const int64_t whole = P.M / kRowTile * kRowTile;
  if (whole > 0) {
    for (int q = 0; q < NV / kQuarter; ++q)
      for (int64_t m0 = 0; m0 < whole; m0 += kRowTile) packed_tile<kRowTile, kQuarter>(P, n0 + q * kQuarter * kLanes, m0);
  }
  switch (P.M - whole) {
    case 1: packed_tile<1, NV>(P, n0, whole); break;
    case 2:
      for (int h = 0; h < NV / kHalf; ++h) packed_tile<2, kHalf>(P, n0 + h * kHalf * kLanes, whole);
      break;
    case 3:
      for (int q = 0; q < NV / kQuarter; ++q) packed_tile<3, kQuarter>(P, n0 + q * kQuarter * kLanes, whole);
      break;
    default: break;
  }
}

constexpr int kBlockVecs = 8;                   // vectors of outputs per packed block
constexpr int kBlock = kBlockVecs * kLanes;     // outputs per packed block
static_assert(kBlock % kPanel == 0, "a packed block is a whole number of panels");

// Packed blocks [b0, b1) of kBlock outputs; the last one may be shorter (N mod kBlock
// outputs, a multiple of kPanel, one panel at a time).
inline void packed_blocks(const SkinnyLinearParams& P, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * kBlock;
    if (n0 + kBlock <= P.N) {
      packed_columns<kBlockVecs>(P, n0);
      continue;
    }
    for (int64_t n = n0; n < P.N; n += kPanel) packed_columns<kPerPanel>(P, n);
  }
}

}  // namespace skinny

// y = x @ weight^T (+ bias) (+ residual). Threads split the output features when the call
// has at least 2^17 multiply-adds (~4 us on one AVX2 core; every weight of 512 KiB or more);
// a smaller call stays on the calling thread, where waking a second one would cost more than
// it saves.
inline void skinny_linear(const SkinnyLinearParams& P) {
  using namespace skinny;
  if (P.M == 0 || P.N == 0) return;
  const bool packed = P.w_packed;
  const int64_t blocks = packed ? (P.N + kBlock - 1) / kBlock : (P.N + kFeatureTile - 1) / kFeatureTile;
  const auto run = [&](int64_t b0, int64_t b1) {
    if (packed) packed_blocks(P, b0, b1);
    else feature_blocks(P, b0, b1);
  };
  const bool wide = P.M * P.N * P.K >= (int64_t{1} << 17);
  if (!wide || at::get_num_threads() == 1) {
    run(0, blocks);
    return;
  }
  at::parallel_for(0, blocks, packed ? 2 : 16, run);
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
