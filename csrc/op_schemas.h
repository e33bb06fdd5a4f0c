// The ONE place where the specdec operator schemas are defined, each with its
// comment: csrc/ops.cpp registers them as torch.ops.specdec.*, and the SIMT emulation
// of the CUDA kernels (csrc/simt/ops_simt.cpp) registers the ops that have a CUDA
// kernel under the same names and signatures as torch.ops.specdec_simt.*.
//
// Shapes: B batch, K drafts per row, V vocabulary.
//
// Errors (every op, raised before anything is written, naming the argument):
// a bad value / shape / device / range or an aliasing problem is a ValueError,
// a wrong dtype a TypeError (csrc/args/common.h). Tensors an op writes must not
// overlap themselves (e.g. expanded) or share a byte with any other argument.
// Problems only the CUDA kernels can see (data-dependent, no host sync) set the
// optional sticky flag tensors instead.
#pragma once

namespace specdec::schemas {

// Fused chain verification of K drafted tokens per row, straight from logits.
//   target_logits   [B, K+1, V] float32|float16|bfloat16  (vocab dim stride 1, else copied)
//   draft_token_ids [B, K] int64|int32
//   draft_probs     [B, K, V] float32|float16|bfloat16, or None = one-hot (deterministic drafts)
//   temperature     float32 [] or [B]; 0 = greedy. A 0-dim CPU tensor is read on the host
//                   (an unusable value raises); otherwise an unusable T makes its row invalid
//   seed, offset    int64 [] (batch-wide, row index mixed in) or [B] (per row)
//   (temperature, seed and offset live on the data's device, or are CPU tensors: 0-dim ones
//   are read on the host, [B] ones copied to the device without a host sync)
//   top_k           int64|int32 [] or [B], or None: keep logits >= the k-th largest (0 = off)
//   top_p           float32 [] or [B], or None: nucleus on the top-k survivors, in (0, 1] (1 = off)
//   min_p           float32 [] or [B], or None: keep p >= min_p * max p, in [0, 1) (0 = off)
//                   (core/filter_math.h; HF warper order; never applied to greedy rows. CPU
//                   tensors are checked on the host (ValueError); a bad value in a device
//                   tensor makes its row invalid)
//   num_drafts      int64|int32 [B] in [0, K], or None (= K): row b tests drafts
//                   0..num_drafts[b]-1, its bonus comes from position num_drafts[b], later
//                   positions are not read (CPU tensor: checked; device: out of range = invalid row)
//   coupled         false: Leviathan's ratio test. true: the token at verified position i of
//                   row b is sample(target_logits[b, i], ..., offset = offset[b] + i) (row b's
//                   sample stream); a draft is accepted iff it equals it (draft_probs not read)
//   probs_input     true: target_logits holds PROBABILITIES (float32 only, >= 0, any scale), read
//                   as log p where a logit is read (core/prob_input.h): no separate log pass;
//                   p = 0 is -inf, a negative / NaN / +inf p makes the row invalid
//   token_logprobs  [B, K+1] float32 contiguous, or None: written in place with the logprob of
//                   each emitted token (NaN past them and for an invalid row), computed from the
//                   softmax stats the kernel takes of that position anyway (core/logprob_math.h
//                   emitted_logprob): no further pass over the logits
//   logprobs_processed  token_logprobs' law: false = raw (log softmax at T = 1, no filter: its
//                   sum is taken in the same stats pass), true = the target's law p' (logprobs)
// A row is invalid (tokens -1, num_accepted 0, valid false) exactly for NaN / +inf logits at
// positions 0..num_drafts[b], all -inf logits at a used position, an unusable temperature or
// filter value, num_drafts[b] outside [0, K], a draft id outside [0, V) among the tested ones
// or a bad draft probability the op reads (core/verify_math.h); finite logits never are.
// returns tokens [B, K+1] int64 (accepted drafts, correction/bonus, then -1),
//         num_accepted [B] int64, valid [B] bool
inline constexpr const char* kVerifySchema =
    "verify(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, "
    "Tensor temperature, Tensor seed, Tensor offset, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None, Tensor? num_drafts=None, bool coupled=False, bool probs_input=False, "
    "Tensor(a!)? token_logprobs=None, bool logprobs_processed=False) -> (Tensor, Tensor, Tensor)";

// Block verification of K drafted tokens per row (core/block_verify.h: Sun et al., ICLR 2025):
// the draft block is verified jointly from the on-path probabilities; the emitted tokens follow
// the target's (filtered) law exactly, as with verify, and the expected number of accepted
// drafts is never below verify's. With draft_probs None (one-hot drafts) the law of the
// emitted tokens equals verify's (no gain). Arguments as verify without coupled mode and
// token_logprobs (the Python wrapper takes logprobs from specdec::logprobs). Greedy rows are
// verify's (longest matching prefix). A row is invalid as in verify, where the draft
// probabilities read are q(x) of every tested draft and the whole q row of every position
// whose residual mass is taken (drafts 2..n while the block weight is positive) or raced.
// returns tokens [B, K+1] int64, num_accepted [B] int64, valid [B] bool (as verify)
inline constexpr const char* kVerifyBlockSchema =
    "verify_block(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, "
    "Tensor temperature, Tensor seed, Tensor offset, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None, Tensor? num_drafts=None, bool probs_input=False) -> (Tensor, Tensor, Tensor)";

// Fused draft-step sampler: temperature softmax + one draw per row.
//   logits      [B, V] float32|float16|bfloat16 (any row stride)
//   temperature, seed, offset as in verify
//   probs_out   [B, V] float32 written in place with the normalised (filtered) probabilities
//               (may be a strided slice such as draft_probs[:, i]), or None
//   top_k, top_p, min_p as in verify: the draw and probs_out follow the filtered law q'
//   probs_input as in verify (logits holds float32 probabilities)
//   token_logprobs [B] float32 contiguous, or None; logprobs_processed: as in verify (the
//               sampled token's logprob from the row's stats; NaN for an invalid row)
// returns tokens [B] int64 (-1 for a row with NaN / +inf / all -inf logits or an unusable
// temperature or filter value; such a row's probs_out is all 0)
inline constexpr const char* kSampleSchema =
    "sample(Tensor logits, Tensor temperature, Tensor seed, Tensor offset, "
    "Tensor(a!)? probs_out, Tensor? top_k=None, Tensor? top_p=None, Tensor? min_p=None, "
    "bool probs_input=False, Tensor(b!)? token_logprobs=None, bool logprobs_processed=False) -> Tensor";

// The filtered law of each row WITHOUT a draw: sample's passes up to the race, the same
// cutoffs (core/filter_math.h) and the same arithmetic, so the result is bit for bit what
// sample(..., probs_out=) writes for the same row.
//   logits, temperature, top_k, top_p, min_p, probs_input: as in sample
// returns probs [B, V] float32: the renormalised filtered law (one-hot at the first argmax
// for a greedy row, all 0 for an invalid row, as sample's probs_out)
inline constexpr const char* kFilteredProbsSchema =
    "filtered_probs(Tensor logits, Tensor temperature, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None, bool probs_input=False) -> Tensor";

// Fused temperature softmax of each row (FlashInfer's sampling.softmax): filtered_probs with no
// filter, i.e. the same passes and arithmetic, so the same bits, in one launch.
//   logits      [B, V] float32|float16|bfloat16 (vocab dim stride 1, else copied)
//   temperature float32 [] or [B], as in sample; 0 = one-hot at the first argmax
// returns probs [B, V] float32, softmax(logits / temperature); all 0 for a row with a NaN / +inf
// logit, all -inf, or an unusable per-row temperature (as filtered_probs)
inline constexpr const char* kSoftmaxSchema = "softmax(Tensor logits, Tensor temperature) -> Tensor";

// The same cutoffs as filtered_probs, applied to the logits: returns [B, V] in the logits'
// dtype, each logit copied where it is kept and -inf elsewhere (the first argmax only for a
// greedy row; all NaN for an invalid row). The temperature only moves the top-p / min-p
// cutoffs: the output is not divided by it, so softmax(out / T) == filtered_probs.
inline constexpr const char* kMaskLogitsSchema =
    "mask_logits(Tensor logits, Tensor temperature, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None) -> Tensor";

// Log-probabilities of the emitted tokens, their ranks and the top-n per position
// (core/logprob_math.h): the ranks and top-n of verify / sample's `logprobs=n` with n > 0 (the
// wrappers pass the ops' own tokens; the emitted tokens' logprobs come from the ops' own
// token_logprobs output, which equals this op's token_logprobs on the CPU bit for bit).
//   logits       [B, P, V] float32|float16|bfloat16 (float32 probabilities with probs_input)
//   tokens       [B, P] int64|int32: the emitted token per position; < 0 = none: that position
//                is not read and its outputs are NaN / -1 (a token >= V: no logprob / rank,
//                NaN / -1, the top-n still filled)
//   temperature, top_k, top_p, min_p: as in verify; read for the processed law only
//   num_top      n in [0, 128]
//   processed    false: log softmax(logits) at T = 1, no filter ("raw"); true: log of the
//                target's temperature-scaled, filtered law p' (greedy: one-hot at the first argmax)
// returns token_logprobs [B, P] float32, token_ranks [B, P] int64 (1-based: the tokens whose
// logit is >= the token's; -1 where no token), top_ids [B, P, n] int64 (the n largest logits,
// ties by lower id; -1 past V), top_logprobs [B, P, n] float32 (-inf outside the kept set)
inline constexpr const char* kLogprobsSchema =
    "logprobs(Tensor logits, Tensor tokens, Tensor temperature, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None, int num_top=0, bool processed=False, bool probs_input=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)";

// Fused verification of a TREE of drafts (core/tree_params.h: the walk, its random numbers).
// Shapes: N tree nodes (node 0 = the root, the last committed token), D = depth.
//   target_logits   [B, N, V] float32|float16|bfloat16: the target's prediction after node n
//   tree_token_ids  [B, N] int64|int32: node n's token (node 0's entry is not read)
//   parents         [N] or [B, N] int64|int32: parents[0] = -1, 0 <= parents[n] < n. A CPU
//                   tensor is checked on the host (ValueError, also for a tree deeper than
//                   `depth`); on a device a malformed row is an invalid row
//   draft_probs     [B, N, V] float32|float16|bfloat16: q_n, the law node n's children were drawn
//                   from (i.i.d.), or None: deterministic children (e.g. the draft's top-k)
//   temperature, seed, offset, top_k, top_p, min_p: as in verify
//   depth           D >= the tree's depth, in [0, N - 1]: the outputs' width is D + 1
// A row is invalid (all outputs -1, num_accepted 0, valid false) for NaN / +inf logits at any
// node, all -inf logits at a visited node, an unusable temperature or filter value, a node
// token outside [0, V), a malformed parents row, or a bad draft probability the op reads
// (q(x) of every tested child, the whole q row at a node where a child is rejected).
// returns tokens [B, D+1] int64 (accepted tokens, the correction / bonus token, then -1),
//         path [B, D+1] int64 (0, then the accepted nodes, then -1: the entries whose KV a
//         cache keeps), num_accepted [B] int64, valid [B] bool
inline constexpr const char* kVerifyTreeSchema =
    "verify_tree(Tensor target_logits, Tensor tree_token_ids, Tensor parents, Tensor? draft_probs, "
    "Tensor temperature, Tensor seed, Tensor offset, int depth, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None) -> (Tensor, Tensor, Tensor, Tensor)";

// Vocabulary-parallel verify (core/shard_math.h): one step on one rank of a vocabulary split
// into contiguous shards. specdec_ext.distributed runs the steps and all-gathers each step's
// output between them (O(B * (K+1)) values per rank, never O(V)); on shards whose bounds are
// multiples of 128 the tokens are verify's on the gathered logits, bit for bit.
//   target_logits   [B, K+1, V_r] float32|float16|bfloat16: this rank's logits, tokens
//                   [shard_bounds[rank], shard_bounds[rank+1])
//   draft_token_ids [B, K] int64|int32: GLOBAL ids (a tested id outside [0, V): invalid row)
//   draft_probs     [B, K, V_r] float32|float16|bfloat16 (this rank's shard), or None
//   temperature, seed, offset, top_k, top_p, min_p, num_drafts, coupled: as in verify (every
//                   rank passes the same; top_k, top_p, min_p count for the WHOLE vocabulary,
//                   each given one adds its radix passes as steps)
//   shard_bounds    int[P+1]: 0 = b_0 < b_1 < ... < b_P = V < 2^23; rank r holds [b_r, b_{r+1})
//   rank            this rank, in [0, P)
//   stage           0: check the arguments and return int64 [1] = S, the number of steps (3 +
//                   4 with top_k + 4 with top_p + 1 with min_p); s in [1, S]: run step s
//   gathered        the outputs of steps 1 .. stage-1 of every rank, step-major, in rank order
// returns step s's output [B, K+1, width]: float64 (max / argmax: 2; tile-sum cover + e_x, q_x;
// races: 7) or int64 (filter passes: 256 counts, 256 counts + 256 masses, 1 min-p key)
inline constexpr const char* kVerifyShardSchema =
    "verify_shard(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, Tensor temperature, "
    "Tensor seed, Tensor offset, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor? num_drafts, bool coupled, "
    "int[] shard_bounds, int rank, int stage, Tensor[] gathered) -> Tensor";

// The last step of vocabulary-parallel verify: the tokens, from the S * P gathered step outputs
// (arguments as verify_shard; every rank gets the same result). Returns verify's (tokens
// [B, K+1] int64, num_accepted [B] int64, valid [B] bool).
inline constexpr const char* kVerifyShardFinishSchema =
    "verify_shard_finish(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, Tensor temperature, "
    "Tensor seed, Tensor offset, Tensor? top_k, Tensor? top_p, Tensor? min_p, Tensor? num_drafts, bool coupled, "
    "int[] shard_bounds, int rank, Tensor[] gathered) -> (Tensor, Tensor, Tensor)";

// ---- DEBUG / TEST ONLY: slow scalar references (csrc/cpu/sampling_cpu.cpp, CPU kernels only) ----
// The readable statement of the algorithm (core/verify_math.h: verify_row_reference,
// sample_row_reference) run one row at a time, with exactly the argument handling
// (prepare_verify / prepare_sample) and the RNG keying (make_row_rng) of verify / sample, so
// that tests can compare the fused kernels with it row by row. Orders of magnitude slower than
// the fused ops; no CUDA kernel and no fake kernel: not for production or torch.compile.
//   verify_reference: arguments and results as verify
//   sample_reference: arguments as sample; returns tokens [B] int64 and probs [B, V] float32
//                     (what sample writes to probs_out)
inline constexpr const char* kVerifyReferenceSchema =
    "verify_reference(Tensor target_logits, Tensor draft_token_ids, Tensor? draft_probs, "
    "Tensor temperature, Tensor seed, Tensor offset, Tensor? top_k=None, Tensor? top_p=None, "
    "Tensor? min_p=None, Tensor? num_drafts=None, bool coupled=False, bool probs_input=False) "
    "-> (Tensor, Tensor, Tensor)";
inline constexpr const char* kSampleReferenceSchema =
    "sample_reference(Tensor logits, Tensor temperature, Tensor seed, Tensor offset, "
    "Tensor? top_k=None, Tensor? top_p=None, Tensor? min_p=None, bool probs_input=False) -> (Tensor, Tensor)";

// ---- KV cache (csrc/cpu/kv_cache_cpu.cpp, csrc/cuda/kv_cache_cuda.cu) ----
// Shapes: H kv heads, D head dim, M = max_len, S new tokens per row, T tokens,
// NB blocks of BS slots (slot = block * BS + offset). Cache dtypes: float32|float16|bfloat16;
// new keys/values must have the cache's dtype (never converted). Head dim stride 1.

// Write each row's S new tokens at positions lengths[b] .. lengths[b]+S-1 (lengths NOT advanced).
//   key_cache, value_cache [B, H, M, D] (mutated; any strides with stride(3) == 1)
//   new_k, new_v           [B, H, S, D] same dtype as the cache (any strides)
//   lengths                [B] int32|int64, cache's device
//   overflow               [B] bool or None: sticky flags, set (never cleared) by the CUDA kernel
//                          for a row with lengths[b] < 0 or lengths[b] + S > M; that row is
//                          skipped. CPU: such a batch raises ValueError before writing (flags
//                          untouched).
inline constexpr const char* kKvAppendSchema =
    "kv_append_(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor new_k, Tensor new_v, "
    "Tensor lengths, Tensor(c!)? overflow=None) -> ()";

// lengths[b] -= num_appended - num_kept[b], in place, on the device (no host sync).
//   lengths   [B] int32|int64 (mutated)
//   num_kept  [B] int32|int64 on lengths' device, in [0, num_appended] (e.g. num_accepted + 1)
//   invalid   [B] bool or None: sticky flags, set by the CUDA kernel for a row whose num_kept is
//             outside [0, num_appended], whose current length is negative or whose length would
//             go negative; that row's length is left unchanged. CPU: such a batch raises
//             ValueError before writing (flags untouched). Overflow-free for any int64 values.
inline constexpr const char* kKvRollbackSchema =
    "kv_rollback_(Tensor(a!) lengths, int num_appended, Tensor num_kept, "
    "Tensor(b!)? invalid=None) -> ()";

// Paged write: token t goes to slot slot_mapping[t] (-1 = padding, skipped).
//   key_cache, value_cache [NB, BS, H, D] (mutated; stride(3) == 1)
//   new_k, new_v           [T, H, D] same dtype as the cache (any strides)
//   slot_mapping           [T] int64|int32; valid slots distinct
//   invalid                [] bool (one element) or None: sticky flag, set by the CUDA kernel
//                          when a slot is outside [0, NB*BS) and not -1 (that token is skipped).
//                          CPU: raises ValueError before writing on such a slot or a repeated slot.
inline constexpr const char* kPagedKvAppendSchema =
    "paged_kv_append_(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor new_k, Tensor new_v, "
    "Tensor slot_mapping, Tensor(c!)? invalid=None) -> ()";

// Gather a paged cache into dense tensors for attention (e.g. SDPA).
//   key_cache, value_cache [NB, BS, H, D] (read only: they may be the same tensor, or expanded)
//   block_tables           [B, max_blocks_per_seq] int32 (int64 accepted)
//   lengths                [B] int32|int64
// returns keys, values [B, H, max_len, D] contiguous, cache dtype; zero at positions >= lengths[b].
// CPU raises ValueError on lengths[b] outside [0, min(max_len, max_blocks_per_seq * BS)] or a used table
// entry outside [0, NB); CUDA clamps the length into that range and zero-fills positions whose
// table entry is out of range.
inline constexpr const char* kPagedKvGatherSchema =
    "paged_kv_gather(Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor lengths, "
    "int max_len) -> (Tensor, Tensor)";

// paged_kv_gather into caller-owned buffers (reused across steps; CUDA-graph friendly).
//   keys_out, values_out [B, H, max_len, D] (mutated) cache dtype, stride(3) == 1, other strides free;
//   max_len = keys_out.size(2). Same rules as paged_kv_gather; CPU writes nothing on an error.
inline constexpr const char* kPagedKvGatherIntoSchema =
    "paged_kv_gather_into_(Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor lengths, "
    "Tensor(a!) keys_out, Tensor(b!) values_out) -> ()";

// Compact each row's accepted tokens in place after tree verification: for every row b and
// j < count[b], position lengths[b] + j receives what position lengths[b] + src_index[b, j]
// held BEFORE the call (all heads, all of D; keys and values). lengths are NOT changed (advance
// them by count afterwards). Sources and destinations may overlap: src_index[b, :count[b]] is
// strictly increasing from >= 0 (so src_index[b, j] >= j) and j is walked upwards per element.
// Typical use: src_index = the verified tree path (root 0, then the accepted nodes), count =
// num_accepted + 1, lengths = the length before the tree's N nodes went to lengths[b] ..
// lengths[b]+N-1. Entries past count[b] are not read.
//   key_cache, value_cache [B, H, M, D] (mutated; any strides with stride(3) == 1; not sharing bytes)
//   lengths                [B] int32|int64 in [0, M]
//   src_index              [B, P] int64|int32 (any strides)
//   count                  [B] int32|int64 in [0, P]
//   invalid                [B] bool or None: sticky flags, set by the CUDA kernel for a row whose
//                          lengths, count or src_index break these rules or whose lengths[b] +
//                          src_index[b, j] >= M; nothing is written to that row. CPU: such a batch
//                          raises ValueError before writing (flags untouched).
// lengths, src_index and count on the cache's device.
inline constexpr const char* kKvCompactSchema =
    "kv_compact_(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor lengths, Tensor src_index, "
    "Tensor count, Tensor(c!)? invalid=None) -> ()";

// kv_compact_ on a paged cache: position p of row b lives at slot block_tables[b, p // BS] * BS +
// p % BS; the same moves, positions lengths[b] + j <- lengths[b] + src_index[b, j].
//   key_cache, value_cache [NB, BS, H, D] (mutated; stride(3) == 1)
//   block_tables           [B, max_blocks_per_seq] int32|int64
//   lengths                [B] int32|int64 in [0, max_blocks_per_seq * BS]
//   src_index, count       as in kv_compact_, with lengths[b] + src_index[b, j] < max_blocks_per_seq * BS
//   invalid                [B] bool or None: as in kv_compact_, also for a row whose table entry of a
//                          position it moves from or to is outside [0, NB)
// No slot may be written by one (row, position) and used by another (e.g. a fork's shared blocks must
// hold only positions < lengths[b]): CPU raises ValueError; CUDA does not detect it (undefined result).
inline constexpr const char* kPagedKvCompactSchema =
    "paged_kv_compact_(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor block_tables, Tensor lengths, "
    "Tensor src_index, Tensor count, Tensor(c!)? invalid=None) -> ()";

// ---- Dense layers ----

// A linear layer over a few rows, for the verification pass's matmuls on a CPU (CPU only):
// y = x @ weight^T (+ bias) (+ residual). Every weight element is read once per call whatever
// M; with the weight packed, 2 to ~17 rows cost little more than one row (torch's BLAS path is
// a GEMV for one row and a slower GEMM above). Row-invariant: each output is one dot product
// in a fixed order (csrc/cpu/skinny_linear_kernels.h; the order depends on the layout), so a
// row's result is the same bits whatever other rows the call holds, on any thread count.
//   x         [M, K] float32 (last dim stride 1, else copied)
//   weight    [N, K] float32 (last dim stride 1, else copied): an nn.Linear weight; or packed
//             [N / 16, K, 16] float32 (contiguous, else copied; specdec_ext.pack_linear_weight)
//   bias      [N] float32, or None
//   residual  [M, N] float32, or None: added after the bias (a decoder's residual stream)
// returns y [M, N] float32, contiguous (a new tensor: the arguments are only read)
inline constexpr const char* kSkinnyLinearSchema =
    "skinny_linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor";

// ---- The op table: every op declared ONCE. csrc/ops.cpp defines each as torch.ops.specdec.*,
// puts the device rule (BackendSelect) in front of each and exports the table to Python
// (specdec_ext._C.OPS, read by specdec_ext/ops/registry.py, which the tests, the SIMT wrappers and
// the coverage gate derive their op lists from); csrc/simt/ops_simt.cpp defines the ops with a
// CUDA kernel as torch.ops.specdec_simt.*. A backend's kernels are registered next to its
// launchers (csrc/cpu, csrc/cuda, csrc/simt); the registry test (python_tests/test_op_registry.py)
// fails when one is missing.

// Where an op has kernels.
enum Backend : unsigned { kCpu = 1u, kCuda = 2u };

// The tensor arguments that may be CPU tensors when the data is on an accelerator (a 0-dim one
// is read on the host, a [B] one copied without a host sync); comma-separated.
inline constexpr const char* kSamplingHostArgs = "temperature,seed,offset,top_k,top_p,min_p,num_drafts";
inline constexpr const char* kTreeHostArgs = "temperature,seed,offset,top_k,top_p,min_p,parents";
inline constexpr const char* kNoHostArgs = "";

struct OpDecl {
  const char* name;       // the op's name (torch.ops.specdec.<name>)
  const char* schema;     // its schema, above
  unsigned backends;      // Backend bits: where its kernels are
  const char* host_args;  // the tensor arguments that may stay on the host
  const char* cuda_file;  // the csrc/cuda file holding its kernel bodies (nullptr: no CUDA kernel)
};

inline constexpr OpDecl kOps[] = {
    {"verify", kVerifySchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"verify_block", kVerifyBlockSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/block_kernels.cuh"},
    {"sample", kSampleSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"filtered_probs", kFilteredProbsSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"mask_logits", kMaskLogitsSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"softmax", kSoftmaxSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"logprobs", kLogprobsSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/sampling_kernels.cuh"},
    {"verify_tree", kVerifyTreeSchema, kCpu | kCuda, kTreeHostArgs, "cuda/tree_kernels.cuh"},
    {"verify_shard", kVerifyShardSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/shard_kernels.cuh"},
    {"verify_shard_finish", kVerifyShardFinishSchema, kCpu | kCuda, kSamplingHostArgs, "cuda/shard_kernels.cuh"},
    {"verify_reference", kVerifyReferenceSchema, kCpu, kSamplingHostArgs, nullptr},
    {"sample_reference", kSampleReferenceSchema, kCpu, kSamplingHostArgs, nullptr},
    {"kv_append_", kKvAppendSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"kv_rollback_", kKvRollbackSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"paged_kv_append_", kPagedKvAppendSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"paged_kv_gather", kPagedKvGatherSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"paged_kv_gather_into_", kPagedKvGatherIntoSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"kv_compact_", kKvCompactSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"paged_kv_compact_", kPagedKvCompactSchema, kCpu | kCuda, kNoHostArgs, "cuda/kv_kernels.cuh"},
    {"skinny_linear", kSkinnyLinearSchema, kCpu, kNoHostArgs, nullptr},
};

// The index in kOps of the op named `name` (an unqualified name), or -1. constexpr: the
// backends' registrations check their ops against the table at compile time (op_adapters.h).
// An index, not a pointer: GCC's -fsanitize=undefined (the SIMT ASan build) makes a pointer
// compared with nullptr no constant expression.
constexpr int find_op(const char* name) {
  for (int i = 0; i < static_cast<int>(sizeof(kOps) / sizeof(kOps[0])); ++i) {
    const char* a = kOps[i].name;
    const char* b = name;
    while (*a != '\0' && *a == *b) ++a, ++b;
    if (*a == '\0' && *b == '\0') return i;
  }
  return -1;
}

// How many ops of the table have kernels on `backend` (a Backend bit).
constexpr int count_ops(unsigned backend) {
  int n = 0;
  for (const OpDecl& op : kOps) n += (op.backends & backend) != 0;
  return n;
}

}  // namespace specdec::schemas
