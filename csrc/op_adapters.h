// One adapter per op, generic over the backend. An op descriptor (below) holds the op's
// C++ argument list ONCE, in schema order (`prepare`), and says what it returns, when it
// has nothing to run, which outputs the SIMT emulation poisons and which kernel it runs;
// a backend says how its arguments are checked and how its kernels are called:
//
//   struct Backend {
//     static constexpr Target target;              // HostChecks, and which kernels the shard steps run
//     static constexpr bool poisons;               // fill the outputs with Op::poison before the kernel
//     struct Scope { explicit Scope(const at::Tensor& first); };  // around everything (CUDA: device guard)
//     template <class F> static void run(const at::Tensor& first, F&& f);  // f(kernel set)
//   };
//
// The kernel set is a tag (cpu::Avx2 / cpu::Default, simt_ops::Simt, cuda::Kernels with the
// device, stream and workspace): each descriptor's launch calls `<kernel>_kernel(k, params...)`,
// found by argument-dependent lookup in the backend's namespace. A backend registers its
// ops with register_ops<Backend, Op...>(m) (csrc/cpu, csrc/cuda, csrc/simt).
#pragma once
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

#include "kv_args.h"
#include "linear_args.h"
#include "op_schemas.h"
#include "sampling_args.h"

namespace specdec::ops {

using OptTensor = std::optional<at::Tensor>;

// How a backend prepares arguments: which per-row tensors the host checks, and whether the
// shard steps run the CUDA kernels' plan (ShardPlan::pairs; CUDA and its SIMT emulation).
struct Target {
  HostChecks checks = HostChecks::kCpuTensors;
  bool cuda_kernels = false;
};

// The integer outputs start as a value no kernel writes (at::empty on a GPU holds whatever
// was there): an output element the kernels forget shows as this, not as a plausible 0.
// Used by the SIMT backend only (Backend::poisons).
inline constexpr int64_t kUnwritten = 0x5A5A5A5A5A5A5A5ALL;
inline void poison_ints(std::initializer_list<at::Tensor> ts) {
  for (const at::Tensor& t : ts) t.fill_(kUnwritten);
}
// An element the kernels forget shows (never a probability; rarely a logit).
inline void poison_bytes(const at::Tensor& t) { t.view(at::kByte).fill_(0x5A); }

// ---- Sampling ops (schemas: op_schemas.h; argument handling: sampling_args.h) ----

// verify's and verify_shard_finish's outputs (tokens, num_accepted, valid).
struct VerifyOutputs {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> outputs(const VerifyLaunch& L) {
    return {L.tokens, L.num_accepted, L.valid};
  }
  static void poison(const VerifyLaunch& L) { poison_ints({L.tokens, L.num_accepted}); }
};

struct VerifyOp : VerifyOutputs {
  static constexpr const char* name = "verify";
  using Launch = VerifyLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                      const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input,
                      const OptTensor& token_logprobs, bool logprobs_processed) {
    L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input,
                       TokenLogprobsArg{token_logprobs, logprobs_processed}, t.checks);
  }
  static bool empty(const Launch& L) { return L.params.B == 0; }
  template <class K>
  static void launch(K k, Launch& L) { verify_kernel(k, L.params, L.logits_dtype, L.probs_dtype); }
};

struct VerifyBlockOp : VerifyOutputs {
  static constexpr const char* name = "verify_block";
  using Launch = VerifyLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                      const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, const OptTensor& num_drafts, bool probs_input) {
    L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, /*coupled=*/false, probs_input, {},
                       t.checks);
  }
  static bool empty(const Launch& L) { return L.params.B == 0; }
  template <class K>
  static void launch(K k, Launch& L) { verify_block_kernel(k, L.params, L.logits_dtype, L.probs_dtype); }
};

struct SampleOp {
  static constexpr const char* name = "sample";
  using Launch = SampleLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& logits, const at::Tensor& temperature,
                      const at::Tensor& seed, const at::Tensor& offset, const OptTensor& probs_out,
                      const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p, bool probs_input,
                      const OptTensor& token_logprobs, bool logprobs_processed) {
    L = prepare_sample(logits, temperature, seed, offset, probs_out, SamplingFilters{top_k, top_p, min_p},
                       probs_input, TokenLogprobsArg{token_logprobs, logprobs_processed}, t.checks);
  }
  static bool empty(const Launch& L) { return L.params.B == 0; }
  static void poison(const Launch& L) { poison_ints({L.tokens}); }
  static at::Tensor outputs(const Launch& L) { return L.tokens; }
  template <class K>
  static void launch(K k, Launch& L) { sample_kernel(k, L.params, L.logits_dtype); }
};

// filtered_probs, mask_logits and softmax: one kernel (prepare_filtered says what it writes).
struct FilteredBase {
  using Launch = SampleLaunch;
  static bool empty(const Launch& L) { return L.params.B == 0; }
  static void poison(const Launch& L) { poison_bytes(L.out); }
  static at::Tensor outputs(const Launch& L) { return L.out; }
  template <class K>
  static void launch(K k, Launch& L) { filtered_kernel(k, L.params, L.logits_dtype); }
};

struct FilteredProbsOp : FilteredBase {
  static constexpr const char* name = "filtered_probs";
  static void prepare(Launch& L, Target t, const at::Tensor& logits, const at::Tensor& temperature,
                      const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p, bool probs_input) {
    L = prepare_filtered(logits, temperature, SamplingFilters{top_k, top_p, min_p}, probs_input,
                         FilteredOutput::kProbs, t.checks);
  }
};

struct MaskLogitsOp : FilteredBase {
  static constexpr const char* name = "mask_logits";
  static void prepare(Launch& L, Target t, const at::Tensor& logits, const at::Tensor& temperature,
                      const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p) {
    L = prepare_filtered(logits, temperature, SamplingFilters{top_k, top_p, min_p}, false, FilteredOutput::kMask,
                         t.checks);
  }
};

struct SoftmaxOp : FilteredBase {
  static constexpr const char* name = "softmax";
  static void prepare(Launch& L, Target t, const at::Tensor& logits, const at::Tensor& temperature) {
    L = prepare_filtered(logits, temperature, SamplingFilters{}, false, FilteredOutput::kProbs, t.checks);
  }
};

struct LogprobsOp {
  static constexpr const char* name = "logprobs";
  using Launch = LogprobLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& logits, const at::Tensor& tokens,
                      const at::Tensor& temperature, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, int64_t num_top, bool processed, bool probs_input) {
    L = prepare_logprobs(logits, tokens, temperature, SamplingFilters{top_k, top_p, min_p}, num_top, processed,
                         probs_input, t.checks);
  }
  static bool empty(const Launch& L) { return L.params.B * L.params.positions == 0; }
  static void poison(const Launch& L) {
    poison_ints({L.top_ids, L.token_ranks});
    poison_bytes(L.token_logprobs);
    poison_bytes(L.top_logprobs);
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> outputs(const Launch& L) {
    return {L.token_logprobs, L.token_ranks, L.top_ids, L.top_logprobs};
  }
  template <class K>
  static void launch(K k, Launch& L) { logprobs_kernel(k, L.params, L.logits_dtype); }
};

struct VerifyTreeOp {
  static constexpr const char* name = "verify_tree";
  using Launch = TreeVerifyLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& target_logits, const at::Tensor& tree_token_ids,
                      const at::Tensor& parents, const OptTensor& draft_probs, const at::Tensor& temperature,
                      const at::Tensor& seed, const at::Tensor& offset, int64_t depth, const OptTensor& top_k,
                      const OptTensor& top_p, const OptTensor& min_p) {
    L = prepare_verify_tree(target_logits, tree_token_ids, parents, draft_probs, temperature, seed, offset, depth,
                            SamplingFilters{top_k, top_p, min_p}, t.checks);
  }
  static bool empty(const Launch& L) { return L.params.B == 0; }
  static void poison(const Launch& L) { poison_ints({L.tokens, L.path, L.num_accepted}); }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> outputs(const Launch& L) {
    return {L.tokens, L.path, L.num_accepted, L.valid};
  }
  template <class K>
  static void launch(K k, Launch& L) { verify_tree_kernel(k, L.params, L.logits_dtype, L.probs_dtype); }
};

// The tables the shard kernels read through ShardParams, where a backend must place them (CUDA:
// cuda::shard_tables, found by argument-dependent lookup); the result outlives the launch.
template <class K>
at::Tensor shard_tables(const K&, ShardLaunch&) { return {}; }

// verify_shard's steps and verify_shard_finish: one kernel; the launch stays where it was
// prepared (params point into its vectors).
struct ShardBase {
  template <class K>
  static void launch(K k, ShardLaunch& L) {
    const at::Tensor tables = shard_tables(k, L);
    verify_shard_kernel(k, L.params, L.verify.logits_dtype, L.verify.probs_dtype);
  }
};

struct VerifyShardOp : ShardBase {
  static constexpr const char* name = "verify_shard";
  struct Launch : ShardLaunch {
    bool count_only = false;  // stage 0: out holds the number of steps, nothing runs
  };
  static void prepare(Launch& L, Target t, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                      const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
                      at::IntArrayRef shard_bounds, int64_t rank, int64_t stage, at::TensorList gathered) {
    prepare_shard_step(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, stage,
                       gathered, t.cuda_kernels, t.checks);
    L.count_only = stage == 0;
  }
  static bool empty(const Launch& L) { return L.count_only || L.params.v.B == 0; }
  static void poison(const Launch& L) {
    if (L.out.scalar_type() == at::kLong) poison_ints({L.out});
    else poison_ints({L.out.view(at::kLong)});
  }
  static at::Tensor outputs(const Launch& L) { return L.out; }
};

struct VerifyShardFinishOp : ShardBase {
  static constexpr const char* name = "verify_shard_finish";
  using Launch = ShardLaunch;
  static void prepare(Launch& L, Target t, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                      const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                      const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                      const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
                      at::IntArrayRef shard_bounds, int64_t rank, at::TensorList gathered) {
    prepare_shard_finish(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                         SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, gathered,
                         t.cuda_kernels, t.checks);
  }
  static bool empty(const Launch& L) { return L.params.v.B == 0; }
  static void poison(const Launch& L) { VerifyOutputs::poison(L.verify); }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> outputs(const Launch& L) {
    return VerifyOutputs::outputs(L.verify);
  }
};

// ---- KV-cache ops (kv_args.h): the kernel always runs (the CPU one checks the index
// values on the host; a CUDA one sets the sticky flags); nothing is poisoned ----

template <class Params>
struct KvBase {
  using Launch = kv::Launch<Params>;
  static bool empty(const Launch&) { return false; }
  static void poison(const Launch&) {}
  static void outputs(const Launch&) {}
};

struct KvAppendOp : KvBase<KVAppendParams> {
  static constexpr const char* name = "kv_append_";
  static void prepare(Launch& L, Target, at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                      const at::Tensor& new_v, const at::Tensor& lengths, const OptTensor& overflow) {
    L = kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow);
  }
  template <class K>
  static void launch(K k, Launch& L) { kv_append_kernel(k, L.p); }
};

struct KvRollbackOp : KvBase<KVRollbackParams> {
  static constexpr const char* name = "kv_rollback_";
  static void prepare(Launch& L, Target, at::Tensor& lengths, int64_t num_appended, const at::Tensor& num_kept,
                      const OptTensor& invalid) {
    L.p = kv::prepare_kv_rollback(lengths, num_appended, num_kept, invalid);
  }
  template <class K>
  static void launch(K k, Launch& L) { kv_rollback_kernel(k, L.p); }
};

struct PagedKvAppendOp : KvBase<PagedAppendParams> {
  static constexpr const char* name = "paged_kv_append_";
  static void prepare(Launch& L, Target, at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                      const at::Tensor& new_v, const at::Tensor& slot_mapping, const OptTensor& invalid) {
    L = kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid);
  }
  template <class K>
  static void launch(K k, Launch& L) { paged_append_kernel(k, L.p); }
};

// paged_kv_gather_into_ and paged_kv_gather (which allocates the outputs first): one kernel.
struct GatherBase : KvBase<PagedGatherParams> {
  template <class K>
  static void launch(K k, Launch& L) { paged_gather_kernel(k, L.p); }
};

struct PagedKvGatherIntoOp : GatherBase {
  static constexpr const char* name = "paged_kv_gather_into_";
  static void prepare(Launch& L, Target, const at::Tensor& key_cache, const at::Tensor& value_cache,
                      const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                      at::Tensor& values_out) {
    L.p = kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, keys_out, values_out);
  }
};

struct PagedKvGatherOp : GatherBase {
  static constexpr const char* name = "paged_kv_gather";
  static void prepare(Launch& L, Target, const at::Tensor& key_cache, const at::Tensor& value_cache,
                      const at::Tensor& block_tables, const at::Tensor& lengths, int64_t max_len) {
    L.keep_alive = kv::allocate_gather_outputs(key_cache, value_cache, block_tables, lengths, max_len);
    L.p = kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, L.keep_alive[0],
                                        L.keep_alive[1]);
  }
  static std::tuple<at::Tensor, at::Tensor> outputs(const Launch& L) { return {L.keep_alive[0], L.keep_alive[1]}; }
};

struct KvCompactOp : KvBase<KVCompactParams> {
  static constexpr const char* name = "kv_compact_";
  static void prepare(Launch& L, Target, at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& lengths,
                      const at::Tensor& src_index, const at::Tensor& count, const OptTensor& invalid) {
    L.p = kv::prepare_kv_compact(key_cache, value_cache, lengths, src_index, count, invalid);
  }
  template <class K>
  static void launch(K k, Launch& L) { kv_compact_kernel(k, L.p); }
};

struct PagedKvCompactOp : KvBase<KVCompactParams> {
  static constexpr const char* name = "paged_kv_compact_";
  static void prepare(Launch& L, Target, at::Tensor& key_cache, at::Tensor& value_cache,
                      const at::Tensor& block_tables, const at::Tensor& lengths, const at::Tensor& src_index,
                      const at::Tensor& count, const OptTensor& invalid) {
    L.p = kv::prepare_paged_compact(key_cache, value_cache, block_tables, lengths, src_index, count, invalid);
  }
  template <class K>
  static void launch(K k, Launch& L) { kv_compact_kernel(k, L.p); }
};

// ---- Dense layers (argument handling: linear_args.h) ----

struct SkinnyLinearOp {
  static constexpr const char* name = "skinny_linear";
  using Launch = linear::SkinnyLinearLaunch;
  static void prepare(Launch& L, Target, const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                      const OptTensor& residual) {
    linear::prepare_skinny_linear(L, x, weight, bias, residual);
  }
  static bool empty(const Launch& L) { return L.p.M == 0 || L.p.N == 0; }
  static void poison(const Launch& L) { poison_bytes(L.y); }
  static at::Tensor outputs(const Launch& L) { return L.y; }
  template <class K>
  static void launch(K k, Launch& L) { skinny_linear_kernel(k, L.p); }
};

// ---- The adapter: the op's C++ signature deduced from Op::prepare ----

template <class Op, class Backend, class Prepare = decltype(&Op::prepare)>
struct Adapter;

template <class Op, class Backend, class Launch, class First, class... Rest>
struct Adapter<Op, Backend, void (*)(Launch&, Target, First, Rest...)> {
  static auto call(First first, Rest... rest) {
    const typename Backend::Scope scope(first);
    Launch L;
    Op::prepare(L, Backend::target, first, rest...);
    if (!Op::empty(L)) {
      if constexpr (Backend::poisons) Op::poison(L);
      Backend::run(first, [&L](auto kernels) { Op::launch(kernels, L); });
    }
    return Op::outputs(L);
  }
};

// Whether the op table (op_schemas.h) declares Op with kernels on `backend`.
template <class Op>
constexpr bool declared_for(unsigned backend) {
  const int i = schemas::find_op(Op::name);
  return i >= 0 && (schemas::kOps[i].backends & backend) != 0;
}

// m.impl(Op::name, Adapter<Op, Backend>::call) for each Op; each must be a row of the op table
// with Backend's bit (compile-time check; the registry test, python_tests/test_op_registry.py,
// finds a row that no backend file registers).
template <class Backend, class... Op, class Library>
void register_ops(Library& m) {
  static_assert((declared_for<Op>(Backend::backend) && ...),
                "an op registered here is not declared for this backend in op_schemas.h kOps");
  (m.impl(Op::name, &Adapter<Op, Backend>::call), ...);
}

// register_ops for a backend registered in ONE file (the SIMT emulation): every op the table
// declares for it must be in the list.
template <class Backend, class... Op, class Library>
void register_all_ops(Library& m) {
  static_assert(sizeof...(Op) == schemas::count_ops(Backend::backend),
                "an op the table declares for this backend is missing from its list");
  register_ops<Backend, Op...>(m);
}

}  // namespace specdec::ops
