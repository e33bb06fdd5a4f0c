// torch.ops.specdec_simt.*: every op that has a CUDA kernel, under the same name and
// schema (csrc/op_schemas.h), running the CUDA kernel source in the SIMT emulator on
// CPU tensors. The argument handling is the CUDA launchers' (sampling_args.cpp,
// kv_args.h), with the CPU tensors standing for device tensors: [B] per-row values
// are not checked on the host (a bad value makes its row invalid, as on a GPU).
// Test and debugging use only: python -m specdec_ext.testing.simt builds it.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../kv_args.h"
#include "../op_schemas.h"
#include "../sampling_args.h"
#include "kernels_simt.h"

namespace specdec::simt_ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// The integer outputs start as a value no kernel writes (at::empty on a GPU holds whatever
// was there): an output element the kernels forget shows as this, not as a plausible 0.
constexpr int64_t kUnwritten = 0x5A5A5A5A5A5A5A5ALL;

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_simt(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input,
    const OptTensor& token_logprobs, bool logprobs_processed) {
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input,
                                  TokenLogprobsArg{token_logprobs, logprobs_processed},
                                  HostChecks::kScalarsOnly);
  if (L.params.B > 0) {
    L.tokens.fill_(kUnwritten);
    L.num_accepted.fill_(kUnwritten);
    verify(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_simt(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                       const at::Tensor& offset, const OptTensor& probs_out, const OptTensor& top_k,
                       const OptTensor& top_p, const OptTensor& min_p, bool probs_input,
                      const OptTensor& token_logprobs, bool logprobs_processed) {
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out, SamplingFilters{top_k, top_p, min_p},
                                  probs_input, TokenLogprobsArg{token_logprobs, logprobs_processed}, HostChecks::kScalarsOnly);
  if (L.params.B > 0) {
    L.tokens.fill_(kUnwritten);
    sample(L.params, L.logits_dtype);
  }
  return L.tokens;
}

at::Tensor filtered_simt(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                         const OptTensor& top_p, const OptTensor& min_p, bool probs_input, FilteredOutput output) {
  SampleLaunch L = prepare_filtered(logits, temperature, SamplingFilters{top_k, top_p, min_p}, probs_input, output,
                                    HostChecks::kScalarsOnly);
  if (L.params.B > 0) {
    L.out.view(at::kByte).fill_(0x5A);  // an element the kernels forget shows (never a probability; rarely a logit)
    filtered(L.params, L.logits_dtype);
  }
  return L.out;
}

at::Tensor filtered_probs_simt(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                               const OptTensor& top_p, const OptTensor& min_p, bool probs_input) {
  return filtered_simt(logits, temperature, top_k, top_p, min_p, probs_input, FilteredOutput::kProbs);
}

at::Tensor mask_logits_simt(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                            const OptTensor& top_p, const OptTensor& min_p) {
  return filtered_simt(logits, temperature, top_k, top_p, min_p, false, FilteredOutput::kMask);
}

at::Tensor softmax_simt(const at::Tensor& logits, const at::Tensor& temperature) {
  return filtered_simt(logits, temperature, std::nullopt, std::nullopt, std::nullopt, false, FilteredOutput::kProbs);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_simt(const at::Tensor& logits, const at::Tensor& tokens,
                                                          const at::Tensor& temperature, const OptTensor& top_k,
                                                          const OptTensor& top_p, const OptTensor& min_p,
                                                          int64_t num_top, bool processed, bool probs_input) {
  LogprobLaunch L = prepare_logprobs(logits, tokens, temperature, SamplingFilters{top_k, top_p, min_p}, num_top,
                                     processed, probs_input, HostChecks::kScalarsOnly);
  if (L.params.B * L.params.positions > 0) {
    L.top_ids.fill_(kUnwritten);
    L.token_ranks.fill_(kUnwritten);
    L.token_logprobs.view(at::kByte).fill_(0x5A);
    L.top_logprobs.view(at::kByte).fill_(0x5A);
    logprobs(L.params, L.logits_dtype);
  }
  return {L.token_logprobs, L.token_ranks, L.top_ids, L.top_logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_tree_simt(
    const at::Tensor& target_logits, const at::Tensor& tree_token_ids, const at::Tensor& parents,
    const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset,
    int64_t depth, const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p) {
  TreeVerifyLaunch L = prepare_verify_tree(target_logits, tree_token_ids, parents, draft_probs, temperature, seed,
                                           offset, depth, SamplingFilters{top_k, top_p, min_p},
                                           HostChecks::kScalarsOnly);
  if (L.params.B > 0) {
    L.tokens.fill_(kUnwritten);
    L.path.fill_(kUnwritten);
    L.num_accepted.fill_(kUnwritten);
    verify_tree(L.params, L.logits_dtype, L.probs_dtype);
  }
  return {L.tokens, L.path, L.num_accepted, L.valid};
}

// verify_shard / verify_shard_finish on the CUDA kernels (ShardPlan::pairs), as the CUDA
// launcher runs them; the tables stay in host memory here.
at::Tensor verify_shard_simt(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                             const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                             const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                             const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
                             at::IntArrayRef shard_bounds, int64_t rank, int64_t stage, at::TensorList gathered) {
  ShardLaunch L;
  prepare_shard_step(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                     SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, stage, gathered,
                     /*cuda_kernels=*/true, HostChecks::kScalarsOnly);
  if (stage > 0 && L.params.v.B > 0) {
    if (L.out.scalar_type() == at::kLong) L.out.fill_(kUnwritten);
    else L.out.view(at::kLong).fill_(kUnwritten);
    verify_shard(L.params, L.verify.logits_dtype, L.verify.probs_dtype);
  }
  return L.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_shard_finish_simt(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
    at::IntArrayRef shard_bounds, int64_t rank, at::TensorList gathered) {
  ShardLaunch L;
  prepare_shard_finish(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, gathered,
                       /*cuda_kernels=*/true, HostChecks::kScalarsOnly);
  if (L.params.v.B > 0) {
    L.verify.tokens.fill_(kUnwritten);
    L.verify.num_accepted.fill_(kUnwritten);
    verify_shard(L.params, L.verify.logits_dtype, L.verify.probs_dtype);
  }
  return {L.verify.tokens, L.verify.num_accepted, L.verify.valid};
}

void kv_append_simt(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k, const at::Tensor& new_v,
                    const at::Tensor& lengths, const OptTensor& overflow) {
  kv_append(kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow).p);
}

void kv_rollback_simt(at::Tensor& lengths, int64_t num_appended, const at::Tensor& num_kept,
                      const OptTensor& invalid) {
  kv_rollback(kv::prepare_kv_rollback(lengths, num_appended, num_kept, invalid));
}

void paged_kv_append_simt(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                          const at::Tensor& new_v, const at::Tensor& slot_mapping, const OptTensor& invalid) {
  paged_append(kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid).p);
}

void paged_kv_gather_into_simt(const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                               at::Tensor& values_out) {
  paged_gather(kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, keys_out, values_out));
}

std::tuple<at::Tensor, at::Tensor> paged_kv_gather_simt(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                        const at::Tensor& block_tables, const at::Tensor& lengths,
                                                        int64_t max_len) {
  return kv::gather_by_allocating(key_cache, value_cache, block_tables, lengths, max_len,
                                  &paged_kv_gather_into_simt);
}

void kv_compact_simt(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& lengths,
                     const at::Tensor& src_index, const at::Tensor& count, const OptTensor& invalid) {
  kv_compact(kv::prepare_kv_compact(key_cache, value_cache, lengths, src_index, count, invalid));
}

void paged_kv_compact_simt(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& lengths, const at::Tensor& src_index, const at::Tensor& count,
                           const OptTensor& invalid) {
  kv_compact(kv::prepare_paged_compact(key_cache, value_cache, block_tables, lengths, src_index, count, invalid));
}

}  // namespace
}  // namespace specdec::simt_ops

TORCH_LIBRARY(specdec_simt, m) {
  for (const auto& op : specdec::schemas::kOps)
    if (op.backends & specdec::schemas::kCuda) m.def(op.schema);
  // Emulator only: [ordinary, cooperative, refused cooperative] launches since the library
  // was loaded (simt::launch_counts), so tests can see which launch path a call took.
  m.def("launch_counts() -> int[]", &specdec::simt_ops::launch_counts);
}

TORCH_LIBRARY_IMPL(specdec_simt, CPU, m) {
  using namespace specdec::simt_ops;
  m.impl("verify", &verify_simt);
  m.impl("sample", &sample_simt);
  m.impl("filtered_probs", &filtered_probs_simt);
  m.impl("mask_logits", &mask_logits_simt);
  m.impl("softmax", &softmax_simt);
  m.impl("logprobs", &logprobs_simt);
  m.impl("verify_tree", &verify_tree_simt);
  m.impl("verify_shard", &verify_shard_simt);
  m.impl("verify_shard_finish", &verify_shard_finish_simt);
  m.impl("kv_append_", &kv_append_simt);
  m.impl("kv_rollback_", &kv_rollback_simt);
  m.impl("paged_kv_append_", &paged_kv_append_simt);
  m.impl("paged_kv_gather", &paged_kv_gather_simt);
  m.impl("paged_kv_gather_into_", &paged_kv_gather_into_simt);
  m.impl("kv_compact_", &kv_compact_simt);
  m.impl("paged_kv_compact_", &paged_kv_compact_simt);
}
