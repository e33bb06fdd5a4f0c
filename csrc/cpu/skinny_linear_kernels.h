// The CPU kernel of skinny_linear (csrc/op_schemas.h), compiled into both instruction-set
// copies (sampling_kernels_default.cpp, sampling_kernels_avx2.cpp) inside CPU_CAPABILITY.
//
// Why: a verification pass multiplies a handful of rows (B * (K + 1)) by each weight. A small
// model's forward on a CPU then streams its weights from memory, and torch's BLAS path spends
// more per call at 2 to 17 rows than at one (a GEMV): measured in the transformers-loaded
// bundled target's forward, its 43 linears took 1.73 ms at 1 row and 2.51 / 2.53 ms at 4 / 17
// rows through F.linear, 1.52 / 1.87 / 1.91 ms through this kernel (models/cpu_linear.py).
// Here every weight row is read once per call, whatever M, so a few rows cost about what one
// row costs.
//
// Order of the arithmetic (the same for every M, tile position and thread count, so a row's
// result never depends on the other rows of the call): output (m, n) is ONE vector accumulator
// of Vec::size() lanes, lane l summing x[m, k] * w[n, k] over k = l, l + W, ... below K rounded
// down to W (fmadd, k ascending); then the lanes in order; then the tail k (fma, ascending);
// then + bias[n]; then + residual[m, n].
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

}  // namespace skinny

// y = x @ weight^T (+ bias) (+ residual). Threads split the output features when the call
// has at least 2^17 multiply-adds (~4 us on one AVX2 core; every weight of 512 KiB or more);
// a smaller call stays on the calling thread, where waking a second one would cost more than
// it saves.
inline void skinny_linear(const SkinnyLinearParams& P) {
  using namespace skinny;
  if (P.M == 0 || P.N == 0) return;
  const int64_t blocks = (P.N + kFeatureTile - 1) / kFeatureTile;
  const bool wide = P.M * P.N * P.K >= (int64_t{1} << 17);
  if (!wide || at::get_num_threads() == 1) {
    feature_blocks(P, 0, blocks);
    return;
  }
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) { feature_blocks(P, b0, b1); });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
