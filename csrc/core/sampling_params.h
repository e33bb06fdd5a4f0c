// Raw-pointer parameter blocks of the sampling ops, shared by the CPU and CUDA
// kernels. Framework-free: the launchers fill them from tensors.
#pragma once
#include <cstdint>

#include "filter_math.h"
#include "macros.h"
#include "rng.h"

namespace specdec {

// Element types the sampling kernels read (logits, draft probabilities). kProbsF32:
// float32 probabilities in place of logits (the probs_input mode, core/prob_input.h),
// only ever a LOGITS dtype (dispatch_logits_dtype).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kProbsF32 = 3 };

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

// The filters of every row (core/filter_math.h). Each is one host value or a
// per-row tensor; `any` is false when no filter argument was given, and then no
// filter pass runs at all.
struct RowFilters {
  ScalarOrRow<int64_t> top_k;  // value 0 = off
  ScalarOrRow<float> top_p{nullptr, 0, 1.0f};  // value 1 = off
  ScalarOrRow<float> min_p;    // value 0 = off
  bool any = false;
  SPECDEC_HD FilterSpec get(int64_t row) const {
    FilterSpec f;
    if (any) {
      f.top_k = top_k.get(row);
      f.top_p = top_p.get(row);
      f.min_p = min_p.get(row);
    }
    return f;
  }
};

// Drafts row `row` tests: num_drafts[row] ([B] with this stride; may be out of range,
// the row is then invalid), or K when num_drafts is nullptr. The one rule of
// VerifyParams::drafts_of and of the CUDA stages that see only these pointers.
SPECDEC_HD int64_t drafts_of_row(const int64_t* num_drafts, int64_t stride, int64_t row, int64_t K) {
  return num_drafts ? num_drafts[row * stride] : K;
}

// verify / sample's `token_logprobs` output: the logprob of each emitted token under one of
// core/logprob_math.h's laws, taken from the softmax stats of its position that the kernel
// computes anyway (emitted_logprob), written in the same launch.
struct EmittedLogprobs {
  float* out = nullptr;    // verify: [B, K+1] contiguous (NaN past the emitted tokens and for an
                           // invalid row); sample: [B] contiguous; nullptr = not asked
  bool processed = false;  // the law: raw (T = 1, no filter) / processed (p')
  // whether the kernel needs the raw law's sum as well as its own (a raw law, and a row whose
  // own law differs: T != 1 or a filter cut)
  SPECDEC_HD bool raw() const { return out != nullptr && !processed; }
};

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
  RowFilters filters;
  const int64_t* num_drafts = nullptr;  // [B] drafts row b tests (in [0, K], else invalid), or nullptr = K
  int64_t num_drafts_stride = 0;
  bool coupled = false;                 // coupled mode (verify_math.h); draft_probs not read
  int64_t* tokens = nullptr;           // [B, K+1] out
  int64_t* num_accepted = nullptr;     // [B] out
  bool* valid = nullptr;               // [B] out
  EmittedLogprobs logprobs;            // optional [B, K+1] out
  // drafts row b tests: num_drafts[b] (may be out of range: the row is then invalid), or K
  SPECDEC_HD int64_t drafts_of(int64_t row) const { return drafts_of_row(num_drafts, num_drafts_stride, row, K); }
};

// specdec::sample, and specdec::filtered_probs / mask_logits (tokens == nullptr: no draw;
// exactly one of probs_out / masked_out is set).
struct SampleParams {
  const void* logits = nullptr;  // [B, V] float32|fp16|bf16
  int64_t logits_stride_b = 0;
  int64_t B = 0, V = 0;
  ScalarOrRow<float> temperature;
  RowRandomness rnd;
  RowFilters filters;
  int64_t* tokens = nullptr;       // [B] out
  float* probs_out = nullptr;      // [B, V] float32 out, or nullptr
  int64_t probs_stride_b = 0;
  void* masked_out = nullptr;      // mask_logits: [B, V] out, the logits' dtype, contiguous
  EmittedLogprobs logprobs;        // sample: optional [B] out
};

}  // namespace specdec
