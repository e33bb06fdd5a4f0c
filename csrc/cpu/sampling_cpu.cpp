// CPU launchers of specdec::verify, sample, filtered_probs and mask_logits: argument handling is
// shared (sampling_args.cpp); here we pick the instruction set and run. Also the
// debug ops verify_reference / sample_reference (the scalar references of
// core/verify_math.h, one row at a time).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "../core/dtype_dispatch.h"
#include "../core/sampling_reference.h"
#include "../sampling_args.h"
#include "sampling_kernels_entry.h"

namespace specdec {
namespace {

// AVX2 copy when the CPU has AVX2 + FMA + F16C, unless SPECDEC_CPU_CAPABILITY=default
// (read per call so tests can compare the two copies in one process).
bool use_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  const char* env = std::getenv("SPECDEC_CPU_CAPABILITY");
  return has && cpu::avx2_compiled() && !(env && std::strcmp(env, "default") == 0);
#else
  return false;
#endif
}

using OptTensor = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input,
    const OptTensor& token_logprobs, bool logprobs_processed) {
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input,
                                  TokenLogprobsArg{token_logprobs, logprobs_processed});
  if (L.params.B > 0) {
    if (use_avx2()) cpu::verify_avx2(L.params, L.logits_dtype, L.probs_dtype);
    else cpu::verify_default(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.num_accepted, L.valid};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_block_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool probs_input) {
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, /*coupled=*/false, probs_input);
  if (L.params.B > 0) {
    if (use_avx2()) cpu::verify_block_avx2(L.params, L.logits_dtype, L.probs_dtype);
    else cpu::verify_block_default(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_cpu(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& probs_out, const OptTensor& top_k,
                      const OptTensor& top_p, const OptTensor& min_p, bool probs_input,
                      const OptTensor& token_logprobs, bool logprobs_processed) {
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out, SamplingFilters{top_k, top_p, min_p},
                                  probs_input, TokenLogprobsArg{token_logprobs, logprobs_processed});
  if (L.params.B > 0) {
    if (use_avx2()) cpu::sample_avx2(L.params, L.logits_dtype);
    else cpu::sample_default(L.params, L.logits_dtype);
  }
  return L.tokens;
}

at::Tensor filtered_cpu(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                        const OptTensor& top_p, const OptTensor& min_p, bool probs_input, FilteredOutput output) {
  SampleLaunch L = prepare_filtered(logits, temperature, SamplingFilters{top_k, top_p, min_p}, probs_input, output);
  if (L.params.B > 0) {
    if (use_avx2()) cpu::filtered_avx2(L.params, L.logits_dtype);
    else cpu::filtered_default(L.params, L.logits_dtype);
  }
  return L.out;
}

at::Tensor filtered_probs_cpu(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                              const OptTensor& top_p, const OptTensor& min_p, bool probs_input) {
  return filtered_cpu(logits, temperature, top_k, top_p, min_p, probs_input, FilteredOutput::kProbs);
}

at::Tensor mask_logits_cpu(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                           const OptTensor& top_p, const OptTensor& min_p) {
  return filtered_cpu(logits, temperature, top_k, top_p, min_p, false, FilteredOutput::kMask);
}

at::Tensor softmax_cpu(const at::Tensor& logits, const at::Tensor& temperature) {
  return filtered_cpu(logits, temperature, std::nullopt, std::nullopt, std::nullopt, false, FilteredOutput::kProbs);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_cpu(const at::Tensor& logits, const at::Tensor& tokens,
                                                         const at::Tensor& temperature, const OptTensor& top_k,
                                                         const OptTensor& top_p, const OptTensor& min_p,
                                                         int64_t num_top, bool processed, bool probs_input) {
  LogprobLaunch L = prepare_logprobs(logits, tokens, temperature, SamplingFilters{top_k, top_p, min_p}, num_top,
                                     processed, probs_input);
  if (L.params.B * L.params.positions > 0) {
    if (use_avx2()) cpu::logprobs_avx2(L.params, L.logits_dtype);
    else cpu::logprobs_default(L.params, L.logits_dtype);
  }
  return {L.token_logprobs, L.token_ranks, L.top_ids, L.top_logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_tree_cpu(
    const at::Tensor& target_logits, const at::Tensor& tree_token_ids, const at::Tensor& parents,
    const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset,
    int64_t depth, const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p) {
  TreeVerifyLaunch L = prepare_verify_tree(target_logits, tree_token_ids, parents, draft_probs, temperature, seed,
                                           offset, depth, SamplingFilters{top_k, top_p, min_p});
  if (L.params.B > 0) {
    if (use_avx2()) cpu::verify_tree_avx2(L.params, L.logits_dtype, L.probs_dtype);
    else cpu::verify_tree_default(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.path, L.num_accepted, L.valid};
}

// verify_shard (stage 0: the number of steps; stage s: step s) and verify_shard_finish on the CPU.
void run_verify_shard(ShardLaunch& L, int64_t stage) {
  if (L.params.v.B == 0 || stage == 0) return;
  if (use_avx2()) cpu::verify_shard_avx2(L.params, L.verify.logits_dtype, L.verify.probs_dtype);
  else cpu::verify_shard_default(L.params, L.verify.logits_dtype, L.verify.probs_dtype);
}

at::Tensor verify_shard_cpu(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                            const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                            const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                            const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
                            at::IntArrayRef shard_bounds, int64_t rank, int64_t stage, at::TensorList gathered) {
  ShardLaunch L;
  prepare_shard_step(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                     SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, stage, gathered,
                     /*cuda_kernels=*/false, HostChecks::kCpuTensors);
  run_verify_shard(L, stage);
  return L.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_shard_finish_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
    at::IntArrayRef shard_bounds, int64_t rank, at::TensorList gathered) {
  ShardLaunch L;
  prepare_shard_finish(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, gathered,
                       /*cuda_kernels=*/false, HostChecks::kCpuTensors);
  run_verify_shard(L, L.params.step + 1);
  return {L.verify.tokens, L.verify.num_accepted, L.verify.valid};
}

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

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_reference_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input) {
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input);
  dispatch_logits_probs<cpu::CpuTypes>(L.logits_dtype, L.probs_dtype, [&](auto tl, auto tq) {
    verify_reference_rows<typename decltype(tl)::type, typename decltype(tq)::type>(L.params);
  });
  return {L.tokens, L.num_accepted, L.valid};
}

std::tuple<at::Tensor, at::Tensor> sample_reference_cpu(const at::Tensor& logits, const at::Tensor& temperature,
                                                        const at::Tensor& seed, const at::Tensor& offset,
                                                        const OptTensor& top_k, const OptTensor& top_p,
                                                        const OptTensor& min_p, bool probs_input) {
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, std::nullopt,
                                  SamplingFilters{top_k, top_p, min_p}, probs_input);
  const SampleParams& P = L.params;
  at::Tensor probs = at::empty({P.B, P.V}, logits.options().dtype(at::kFloat));
  float* out = probs.mutable_data_ptr<float>();
  dispatch_logits_dtype<cpu::CpuTypes>(L.logits_dtype, [&](auto tl) {
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
  return {L.tokens, probs};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("verify_block", &verify_block_cpu);
  m.impl("sample", &sample_cpu);
  m.impl("filtered_probs", &filtered_probs_cpu);
  m.impl("mask_logits", &mask_logits_cpu);
  m.impl("softmax", &softmax_cpu);
  m.impl("logprobs", &logprobs_cpu);
  m.impl("verify_tree", &verify_tree_cpu);
  m.impl("verify_shard", &verify_shard_cpu);
  m.impl("verify_shard_finish", &verify_shard_finish_cpu);
  m.impl("verify_reference", &verify_reference_cpu);
  m.impl("sample_reference", &sample_reference_cpu);
}

}  // namespace specdec
