// Raw-pointer parameter blocks of the sampling ops, shared by the CPU and CUDA
// kernels. Framework-free: the launchers fill them from tensors.
#pragma once
#include <cstdint>

#include "macros.h"
#include "rng.h"

namespace specdec {

// Element types the sampling kernels read (logits, draft probabilities).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// A per-row value that is either one host scalar (ptr == nullptr), one device
// scalar (stride 0) or a [B] tensor (stride = its stride).
template <typename T>
struct ScalarOrRow {
  const T* ptr = nullptr;
  int64_t stride = 0;
  T value = T(0);
  SPECDEC_HD T get(int64_t row) const { return ptr ? ptr[row * stride] : value; }
};

struct RowRandomness {
  ScalarOrRow<int64_t> seed;
  ScalarOrRow<int64_t> offset;
  bool per_row_seed = false;  // seed is a [B] tensor: do not mix in the row index
};

// The Philox stream of row b (core/rng.h keying): the one place where a row's
// seed and offset become its RowRng, for every kernel and the reference.
SPECDEC_HD RowRng make_row_rng(const RowRandomness& r, int64_t b) {
  return RowRng(row_key(static_cast<uint64_t>(r.seed.get(b)), b, r.per_row_seed),
                static_cast<uint64_t>(r.offset.get(b)));
}

// specdec::verify. Element strides of the vocabulary dim are 1.
struct VerifyParams {
  const void* logits = nullptr;       // [B, K+1, V] float32|fp16|bf16
  int64_t logits_stride_b = 0, logits_stride_k = 0;
  const void* draft_probs = nullptr;  // [B, K, V] float32|fp16|bf16, or nullptr (one-hot drafts)
  int64_t probs_stride_b = 0, probs_stride_k = 0;
  const int64_t* draft_ids = nullptr;  // [B, K] contiguous
  int64_t B = 0, K = 0, V = 0;
  ScalarOrRow<float> temperature;      // per row; 0 = greedy; < 0 or NaN = invalid row
  RowRandomness rnd;
  int64_t* tokens = nullptr;           // [B, K+1] out
  int64_t* num_accepted = nullptr;     // [B] out
  bool* valid = nullptr;               // [B] out
};

// specdec::sample.
struct SampleParams {
  const void* logits = nullptr;  // [B, V] float32|fp16|bf16
  int64_t logits_stride_b = 0;
  int64_t B = 0, V = 0;
  ScalarOrRow<float> temperature;
  RowRandomness rnd;
  int64_t* tokens = nullptr;       // [B] out
  float* probs_out = nullptr;      // [B, V] float32 out, or nullptr
  int64_t probs_stride_b = 0;
};

}  // namespace specdec
