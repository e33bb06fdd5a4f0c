// CPU launchers of the sampling ops: every op is an adapter (op_adapters.h) on the CPU
// backend (cpu_backend.h: host checks, the instruction-set choice). Also the debug ops
// verify_reference / sample_reference (the scalar references of core/verify_math.h, one row
// at a time), CPU only.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "../core/dtype_dispatch.h"
#include "../core/sampling_reference.h"
#include "../op_adapters.h"
#include "cpu_backend.h"

namespace specdec {
namespace cpu {

bool use_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  const char* env = std::getenv("SPECDEC_CPU_CAPABILITY");
  return has && avx2_compiled() && !(env && std::strcmp(env, "default") == 0);
#else
  return false;
#endif
}

}  // namespace cpu

namespace {

using ops::OptTensor;

// n elements of a row as float.
template <typename T>
void row_as_float(const T* src, int64_t n, float* dst) {
  for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<float>(src[k]);
}

template <typename TL, typename TQ>
void verify_reference_rows(const VerifyParams& P) {
  const int64_t K = P.K, V = P.V;
  at::parallel_for(0, P.B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> logits((K + 1) * V), probs(P.draft_probs ? K * V : 0);
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t i = 0; i <= K; ++i)
        row_as_float(static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k, V,
                     logits.data() + i * V);
      for (int64_t i = 0; P.draft_probs && i < K; ++i)
        row_as_float(static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b + i * P.probs_stride_k, V,
                     probs.data() + i * V);
      RowOptions opt;
      opt.filter = P.filters.get(b);
      opt.num_drafts = P.drafts_of(b);
      opt.coupled = P.coupled;
      if (opt.num_drafts < 0) opt.num_drafts = K + 1;  // out of range either way: an invalid row
      const ReferenceRowResult r = verify_row_reference(
          logits.data(), P.draft_probs ? probs.data() : nullptr, P.draft_ids + b * K, K, V, P.temperature.get(b),
          make_row_rng(P.rnd, b), P.tokens + b * (K + 1), opt);
      P.num_accepted[b] = r.valid ? r.num_accepted : 0;
      P.valid[b] = r.valid;
    }
  });
}

// verify_reference: verify's arguments without token_logprobs (op_schemas.h).
struct VerifyReferenceOp : ops::VerifyOutputs {
  static constexpr const char* name = "verify_reference";
  using Launch = VerifyLaunch;
  static void prepare(Launch& L, ops::Target t, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                      const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input) {
    L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input, {}, t.checks);
  }
  static bool empty(const Launch&) { return false; }
  template <class K>
  static void launch(K, Launch& L) {
    dispatch_logits_probs<cpu::CpuTypes>(L.logits_dtype, L.probs_dtype, [&](auto tl, auto tq) {
      verify_reference_rows<typename decltype(tl)::type, typename decltype(tq)::type>(L.params);
    });
  }
};

// sample_reference: sample's arguments without the outputs; returns (tokens, probs [B, V] float32).
struct SampleReferenceOp {
  static constexpr const char* name = "sample_reference";
  struct Launch {
    SampleLaunch s;
    at::Tensor probs;
  };
  static void prepare(Launch& L, ops::Target t, const at::Tensor& logits, const at::Tensor& temperature,
                      const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
                      const OptTensor& top_p, const OptTensor& min_p, bool probs_input) {
    L.s = prepare_sample(logits, temperature, seed, offset, std::nullopt, SamplingFilters{top_k, top_p, min_p},
                         probs_input, {}, t.checks);
    L.probs = at::empty({L.s.params.B, L.s.params.V}, logits.options().dtype(at::kFloat));
  }
  static bool empty(const Launch&) { return false; }
  static std::tuple<at::Tensor, at::Tensor> outputs(const Launch& L) { return {L.s.tokens, L.probs}; }
  template <class K>
  static void launch(K, Launch& L) {
    const SampleParams& P = L.s.params;
    float* out = L.probs.mutable_data_ptr<float>();
    dispatch_logits_dtype<cpu::CpuTypes>(L.s.logits_dtype, [&](auto tl) {
      using TL = typename decltype(tl)::type;
      at::parallel_for(0, P.B, 1, [&](int64_t b0, int64_t b1) {
        std::vector<float> row(P.V);
        for (int64_t b = b0; b < b1; ++b) {
          row_as_float(static_cast<const TL*>(P.logits) + b * P.logits_stride_b, P.V, row.data());
          P.tokens[b] = sample_row_reference(row.data(), P.V, P.temperature.get(b), make_row_rng(P.rnd, b),
                                             out + b * P.V, P.filters.get(b));
        }
      });
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  using namespace ops;
  register_ops<cpu::Backend, VerifyOp, VerifyBlockOp, SampleOp, FilteredProbsOp, MaskLogitsOp, SoftmaxOp, LogprobsOp,
               VerifyTreeOp, VerifyShardOp, VerifyShardFinishOp, VerifyReferenceOp, SampleReferenceOp>(m);
}

}  // namespace specdec
