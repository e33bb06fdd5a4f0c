// Tensor-facing argument handling of the sampling ops, shared by the CPU and
// CUDA launchers: every user error is a TORCH_CHECK naming the argument, and
// the result is a raw-pointer parameter block plus the output tensors.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "core/logprob_math.h"
#include "core/sampling_params.h"
#include "core/shard_math.h"
#include "core/tree_params.h"

namespace specdec {

// Which per-row argument tensors the host reads to check their values: every CPU
// tensor (the real devices: a [B] CPU tensor is checked, then copied), or only 0-dim
// ones (the SIMT emulation, csrc/simt: its CPU tensors stand for device tensors, whose
// bad values make their rows invalid instead).
enum class HostChecks { kCpuTensors, kScalarsOnly };

// The optional filter arguments of both ops (None = off).
struct SamplingFilters {
  std::optional<at::Tensor> top_k, top_p, min_p;
};

struct VerifyLaunch {
  VerifyParams params;
  DType logits_dtype = DType::kFloat32;
  DType probs_dtype = DType::kFloat32;
  at::Tensor tokens, num_accepted, valid;  // outputs
  std::vector<at::Tensor> keep_alive;      // converted inputs the params point into
};

struct SampleLaunch {
  SampleParams params;
  DType logits_dtype = DType::kFloat32;
  at::Tensor tokens;                   // output (sample)
  at::Tensor out;                      // output (filtered_probs / mask_logits)
  std::vector<at::Tensor> keep_alive;
};

// verify / sample's optional token_logprobs output (op_schemas.h) and its law.
struct TokenLogprobsArg {
  std::optional<at::Tensor> out;  // verify: [B, K+1], sample: [B]; float32, contiguous
  bool processed = false;
};

// What filtered_probs / mask_logits write.
enum class FilteredOutput { kProbs, kMask };

VerifyLaunch prepare_verify(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                            const std::optional<at::Tensor>& draft_probs,
                            const at::Tensor& temperature, const at::Tensor& seed,
                            const at::Tensor& offset, const SamplingFilters& filters,
                            const std::optional<at::Tensor>& num_drafts, bool coupled, bool probs_input,
                            const TokenLogprobsArg& token_logprobs = {},
                            HostChecks checks = HostChecks::kCpuTensors);

struct TreeVerifyLaunch {
  TreeVerifyParams params;
  DType logits_dtype = DType::kFloat32;
  DType probs_dtype = DType::kFloat32;
  at::Tensor tokens, path, num_accepted, valid;  // outputs
  std::vector<at::Tensor> keep_alive;
};

// verify_tree's arguments (op_schemas.h). parents [N] or [B, N]: a tensor the host
// checks (HostChecks) must describe a tree of depth <= `depth` (ValueError); on a
// device a malformed row is an invalid row.
TreeVerifyLaunch prepare_verify_tree(const at::Tensor& target_logits, const at::Tensor& tree_token_ids,
                                     const at::Tensor& parents, const std::optional<at::Tensor>& draft_probs,
                                     const at::Tensor& temperature, const at::Tensor& seed,
                                     const at::Tensor& offset, int64_t depth, const SamplingFilters& filters,
                                     HostChecks checks = HostChecks::kCpuTensors);

SampleLaunch prepare_sample(const at::Tensor& logits, const at::Tensor& temperature,
                            const at::Tensor& seed, const at::Tensor& offset,
                            const std::optional<at::Tensor>& probs_out, const SamplingFilters& filters,
                            bool probs_input, const TokenLogprobsArg& token_logprobs = {},
                            HostChecks checks = HostChecks::kCpuTensors);

// filtered_probs (kProbs: params.probs_out) / mask_logits (kMask: params.masked_out, the
// logits' dtype; the wrapper never passes probs_input with it): out [B, V] contiguous, no
// tokens, no randomness.
SampleLaunch prepare_filtered(const at::Tensor& logits, const at::Tensor& temperature, const SamplingFilters& filters,
                              bool probs_input, FilteredOutput output, HostChecks checks = HostChecks::kCpuTensors);

struct LogprobLaunch {
  LogprobParams params;
  DType logits_dtype = DType::kFloat32;
  at::Tensor token_logprobs, token_ranks, top_ids, top_logprobs;  // outputs
  std::vector<at::Tensor> keep_alive;
};

// logprobs' arguments (op_schemas.h): logits [B, P, V], tokens [B, P] (the emitted tokens,
// < 0 = none), temperature and filters as in verify (read for the processed law only),
// num_top in [0, kMaxTopLogprobs].
LogprobLaunch prepare_logprobs(const at::Tensor& logits, const at::Tensor& tokens, const at::Tensor& temperature,
                               const SamplingFilters& filters, int64_t num_top, bool processed, bool probs_input,
                               HostChecks checks = HostChecks::kCpuTensors);

struct ShardLaunch {
  VerifyLaunch verify;          // this rank's verify arguments (tokens etc.: finish's outputs)
  ShardParams params;           // params.v: verify.params
  at::Tensor out;               // stage 0: int64 [1] (the number of steps); a step: its output
  std::vector<int64_t> bounds;  // params.layout points here
  std::vector<const void*> gathered[ShardPlan::kMaxSteps];
};

// verify_shard / verify_shard_finish's arguments (op_schemas.h); stage = the number of steps + 1
// is finish. The launch must not be copied or moved afterwards (params point into its vectors).
// cuda_kernels: the steps run the CUDA kernels (ShardPlan::pairs), on a GPU or emulated.
void prepare_verify_shard(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                          const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                          const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                          const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                          int64_t rank, int64_t stage, at::TensorList gathered, bool cuda_kernels = false,
                          HostChecks checks = HostChecks::kCpuTensors);

// verify_shard's arguments: prepare_verify_shard, and stage must be 0 or a step (not finish).
void prepare_shard_step(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                        const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                        const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                        const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                        int64_t rank, int64_t stage, at::TensorList gathered, bool cuda_kernels, HostChecks checks);
// verify_shard_finish's arguments: prepare_verify_shard at the stage after the steps whose
// outputs `gathered` holds, which must be all of them.
void prepare_shard_finish(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                          const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                          const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                          const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                          int64_t rank, at::TensorList gathered, bool cuda_kernels, HostChecks checks);

}  // namespace specdec
