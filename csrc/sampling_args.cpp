#include "sampling_args.h"

#include <limits>
#include <type_traits>

#include <ATen/ops/empty.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>

#include "args/common.h"
#include "core/rng.h"
#include "core/verify_math.h"

namespace specdec {
namespace {

using args::check_device;
using args::float_dtype;
using args::unit_stride_last;

// A per-row value (temperature, seed, offset): a 0-dim CPU tensor (read on the
// host), a 0-dim tensor on the data's device (read by the kernel), or a [B]
// tensor on the data's device or on the CPU with device data (copied without a
// host sync; for CUDA-graph capture pass device tensors: a host-to-device copy
// cannot be captured). `kind` names the scalar form ("a float", "an int").
template <typename T>
ScalarOrRow<T> per_row_value(const at::Tensor& t, const at::Tensor& ref, int64_t B, const char* name,
                             const char* kind, std::vector<at::Tensor>& keep) {
  TORCH_CHECK_VALUE(t.dim() == 0 || (t.dim() == 1 && t.size(0) == B), name, " must be ", kind,
                    " or a tensor of shape [B] = [", B, "], got shape ", t.sizes());
  args::check_device_or_host(t, ref, name, "the logits");
  ScalarOrRow<T> out;
  if (t.dim() == 0 && t.device().is_cpu()) {
    out.value = t.item<T>();
    return out;
  }
  at::Tensor c = t.to(ref.device(), c10::CppTypeToScalarType<T>::value, /*non_blocking=*/true);
  keep.push_back(c);
  out.ptr = c.const_data_ptr<T>();
  out.stride = c.dim() == 0 ? 0 : c.stride(0);
  return out;
}

// temperature: float; a host value must be usable (a per-row one makes its row invalid).
ScalarOrRow<float> per_row_temperature(const at::Tensor& t, const at::Tensor& ref, int64_t B,
                                       std::vector<at::Tensor>& keep) {
  TORCH_CHECK_TYPE(t.is_floating_point(), "temperature must be a float or a floating tensor, got ",
                   t.scalar_type());
  // The one temperature rule holds for every dtype: a nonzero value that float32 rounds to 0
  // (a tiny float64) must not turn greedy, so it becomes NaN here, which the rule refuses
  // (a host value: ValueError; a per-row one: its row invalid). An elementwise op on t's
  // device: no host sync.
  at::Tensor t32 = t;
  if (t.scalar_type() == at::kDouble && t.dim() == 0 && t.device().is_cpu()) {
    const double v = t.item<double>();
    TORCH_CHECK_VALUE(v == 0 || static_cast<float>(v) != 0, "temperature must be 0 (greedy) or a value float32 ",
                      "keeps nonzero, got ", v, ", which float32 rounds to 0");
  } else if (t.scalar_type() == at::kDouble) {
    t32 = t.to(at::kFloat);
    t32 = at::where(t32.eq(0).logical_and(t.ne(0)), std::numeric_limits<float>::quiet_NaN(), t32);
  }
  const ScalarOrRow<float> out = per_row_value<float>(t32, ref, B, "temperature", "a float", keep);
  TORCH_CHECK_VALUE(out.ptr != nullptr || valid_temperature(out.value),
                    "temperature must be >= 0 (0 = greedy), finite and with a finite inverse, got ", out.value);
  return out;
}

// seed / offset: int64 (int32 accepted); int or 0-dim tensor = batch-wide, [B] = per row.
ScalarOrRow<int64_t> per_row_integer(const at::Tensor& t, const at::Tensor& ref, int64_t B,
                                     const char* name, std::vector<at::Tensor>& keep) {
  TORCH_CHECK_TYPE(args::is_index_dtype(t), name, " must be an int or an int64 tensor, got ", t.scalar_type());
  return per_row_value<int64_t>(t, ref, B, name, "an int", keep);
}

RowRandomness randomness(const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& ref,
                         int64_t B, std::vector<at::Tensor>& keep) {
  RowRandomness r;
  r.seed = per_row_integer(seed, ref, B, "seed", keep);
  r.offset = per_row_integer(offset, ref, B, "offset", keep);
  r.per_row_seed = seed.dim() == 1;
  return r;
}

// The host checks the values of `t` (see HostChecks).
bool host_checked(const at::Tensor& t, HostChecks checks) {
  return t.device().is_cpu() && (checks == HostChecks::kCpuTensors || t.dim() == 0);
}

// Values of a CPU tensor (any shape), read on the host.
template <typename T>
std::vector<T> host_values(const at::Tensor& t) {
  at::Tensor c = t.to(c10::CppTypeToScalarType<T>::value).contiguous();
  const T* p = c.const_data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}

// One filter argument: None (off: `f` unchanged), a 0-dim or a [B] tensor of the
// right kind. Values the host can see (CPU tensors) must pass the kernels' rule
// (valid_filter, applied through `set`), else ValueError; a device tensor's bad
// value makes its row invalid (no host sync).
template <typename T, typename Set>
void filter_arg(const std::optional<at::Tensor>& t, const at::Tensor& ref, int64_t B, const char* name,
                const char* range, ScalarOrRow<T>& out, Set set, RowFilters& f, std::vector<at::Tensor>& keep,
                HostChecks checks) {
  if (!t.has_value()) return;
  constexpr bool kInt = std::is_integral_v<T>;
  TORCH_CHECK_TYPE(kInt ? args::is_index_dtype(*t) : t->is_floating_point(), name, " must be ",
                   kInt ? "an int or an int64 tensor" : "a float or a floating tensor", ", got ", t->scalar_type());
  out = per_row_value<T>(*t, ref, B, name, kInt ? "an int" : "a float", keep);  // checks the shape first
  if (host_checked(*t, checks))
    for (T v : host_values<T>(*t)) {
      FilterSpec one;
      set(one, v);
      TORCH_CHECK_VALUE(valid_filter(one), name, " must be ", range, ", got ", v);
    }
  f.any = true;
}

// The filters (core/filter_math.h): top_k, top_p, min_p, each optional; any of them
// needs V < kMaxFilterVocab (a row's 2^-40 fixed-point mass must fit in 63 bits).
RowFilters row_filters(const SamplingFilters& in, const at::Tensor& ref, int64_t B, int64_t V,
                       std::vector<at::Tensor>& keep, HostChecks checks) {
  RowFilters f;
  filter_arg<int64_t>(in.top_k, ref, B, "top_k", ">= 0 (0 = off)", f.top_k,
                      [](FilterSpec& s, int64_t v) { s.top_k = v; }, f, keep, checks);
  filter_arg<float>(in.top_p, ref, B, "top_p", "in (0, 1] (1 = off)", f.top_p,
                    [](FilterSpec& s, float v) { s.top_p = v; }, f, keep, checks);
  filter_arg<float>(in.min_p, ref, B, "min_p", "in [0, 1) (0 = off)", f.min_p,
                    [](FilterSpec& s, float v) { s.min_p = v; }, f, keep, checks);
  TORCH_CHECK_VALUE(!f.any || V < kMaxFilterVocab, "top_k / top_p / min_p need V < 2^23, got V = ", V);
  return f;
}

// The logits argument's dtype: one of the three float dtypes, or (probs_input: the tensor
// holds probabilities, read as log p by the kernels, core/prob_input.h) float32 only.
DType logits_dtype_arg(const at::Tensor& t, const char* name, bool probs_input) {
  if (!probs_input) return float_dtype(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, name, " must be float32 when probs_input=True (it holds ",
                   "probabilities), got ", t.scalar_type());
  return DType::kProbsF32;
}

// draft_probs [B, positions, V] (verify: positions = K; verify_tree: N), on the logits'
// device: its dtype, and ptr / strides of the vocab-contiguous copy kept in `keep`.
DType draft_probs_arg(const at::Tensor& q, const at::Tensor& logits, int64_t B, int64_t positions,
                      const char* positions_name, int64_t V, std::vector<at::Tensor>& keep, const void*& ptr,
                      int64_t& stride_b, int64_t& stride_k) {
  TORCH_CHECK_VALUE(q.dim() == 3, "draft_probs must be [B, ", positions_name, ", V], got shape ", q.sizes());
  const DType dtype = float_dtype(q, "draft_probs");
  TORCH_CHECK_VALUE(q.size(0) == B, "draft_probs has batch size ", q.size(0), " but target_logits has ", B);
  TORCH_CHECK_VALUE(q.size(1) == positions, "draft_probs has ", positions_name, " = ", q.size(1),
                    " but target_logits implies ", positions_name, " = ", positions);
  TORCH_CHECK_VALUE(q.size(2) == V, "draft_probs has vocabulary size ", q.size(2), " but target_logits has ", V);
  check_device(q, logits, "draft_probs", "target_logits");
  at::Tensor qc = unit_stride_last(q);
  keep.push_back(qc);
  ptr = qc.const_data_ptr();
  stride_b = qc.stride(0);
  stride_k = qc.stride(1);
  return dtype;
}

// parents [N] or [B, N] of verify_tree, int64 (int32 accepted), on the logits' device or
// the CPU (copied). A host-checked tensor must describe trees of depth <= `depth`.
void tree_parents_arg(const at::Tensor& parents, const at::Tensor& logits, int64_t B, int64_t N, int64_t depth,
                      HostChecks checks, TreeVerifyParams& P, std::vector<at::Tensor>& keep) {
  TORCH_CHECK_TYPE(args::is_index_dtype(parents), "parents must be an int64 or int32 tensor, got ",
                   parents.scalar_type());
  TORCH_CHECK_VALUE((parents.dim() == 1 && parents.size(0) == N) ||
                        (parents.dim() == 2 && parents.size(0) == B && parents.size(1) == N),
                    "parents must be [N] = [", N, "] or [B, N] = [", B, ", ", N, "], got shape ", parents.sizes());
  args::check_device_or_host(parents, logits, "parents", "target_logits");
  if (host_checked(parents, checks)) {
    const std::vector<int64_t> all = host_values<int64_t>(parents);
    for (size_t r = 0; r < all.size(); r += static_cast<size_t>(N)) {
      const int64_t* row = all.data() + r;
      for (int64_t n = 0; n < N; ++n) {
        TORCH_CHECK_VALUE(valid_parent(row, n), "parents must hold -1 for the root (node 0) and a smaller node index ",
                          "for every other node, got parents[", n, "] = ", row[n]);
        TORCH_CHECK_VALUE(node_depth(row, n) <= depth, "parents describe a tree deeper than depth = ", depth,
                          " (node ", n, " has depth ", node_depth(row, n), ")");
      }
    }
  }
  at::Tensor c = parents.to(logits.device(), at::kLong, /*non_blocking=*/true).contiguous();
  keep.push_back(c);
  P.parents = c.const_data_ptr<int64_t>();
  P.parents_stride_b = c.dim() == 2 ? N : 0;
}

// The optional token_logprobs output: float32, contiguous, of `shape`, on the data's device,
// sharing no byte with what the op reads or with its other output (probs_out).
EmittedLogprobs token_logprobs_arg(const TokenLogprobsArg& a, at::IntArrayRef shape, const char* shape_text,
                                   const at::Tensor& ref, std::initializer_list<args::Named> read,
                                   const std::optional<at::Tensor>& probs_out = std::nullopt) {
  EmittedLogprobs L;
  L.processed = a.processed;
  if (!a.out.has_value()) return L;
  const at::Tensor& o = *a.out;
  TORCH_CHECK_TYPE(o.scalar_type() == at::kFloat, "token_logprobs must be float32, got ", o.scalar_type());
  TORCH_CHECK_VALUE(o.sizes() == shape, "token_logprobs must be ", shape_text, " = ", shape, ", got shape ",
                    o.sizes());
  check_device(o, ref, "token_logprobs", "the logits");
  TORCH_CHECK_VALUE(o.is_contiguous(), "token_logprobs must be contiguous, got strides ", o.strides());
  args::check_writes({args::named(o, "token_logprobs"), args::named(probs_out, "probs_out")}, read);
  L.out = o.mutable_data_ptr<float>();
  return L;
}

}  // namespace

VerifyLaunch prepare_verify(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                            const std::optional<at::Tensor>& draft_probs,
                            const at::Tensor& temperature, const at::Tensor& seed,
                            const at::Tensor& offset, const SamplingFilters& filters,
                            const std::optional<at::Tensor>& num_drafts, bool coupled, bool probs_input,
                            const TokenLogprobsArg& token_logprobs, HostChecks checks) {
  VerifyLaunch L;
  VerifyParams& P = L.params;
  TORCH_CHECK_VALUE(target_logits.dim() == 3, "target_logits must be [B, K+1, V], got shape ", target_logits.sizes());
  L.logits_dtype = logits_dtype_arg(target_logits, "target_logits", probs_input);
  const int64_t B = target_logits.size(0), K = target_logits.size(1) - 1, V = target_logits.size(2);
  TORCH_CHECK_VALUE(K >= 0, "target_logits must be [B, K+1, V] with K+1 >= 1, got shape ", target_logits.sizes());
  TORCH_CHECK_VALUE(V >= 1, "target_logits must have a vocabulary size V >= 1, got shape ", target_logits.sizes());
  TORCH_CHECK_VALUE(K < kMaxPositions, "K must be < 2^24, got ", K);
  TORCH_CHECK_VALUE(draft_token_ids.dim() == 2, "draft_token_ids must be [B, K], got shape ", draft_token_ids.sizes());
  TORCH_CHECK_TYPE(args::is_index_dtype(draft_token_ids), "draft_token_ids must be int64 or int32, got ",
                   draft_token_ids.scalar_type());
  TORCH_CHECK_VALUE(draft_token_ids.size(0) == B, "draft_token_ids has batch size ", draft_token_ids.size(0),
                    " but target_logits has ", B);
  TORCH_CHECK_VALUE(draft_token_ids.size(1) == K, "draft_token_ids has K = ", draft_token_ids.size(1),
              " drafts but target_logits holds K+1 = ", K + 1, " positions");
  check_device(draft_token_ids, target_logits, "draft_token_ids", "target_logits");

  at::Tensor logits = unit_stride_last(target_logits);
  at::Tensor ids = draft_token_ids.to(at::kLong).contiguous();
  L.keep_alive = {logits, ids};
  P.logits = logits.const_data_ptr();
  P.logits_stride_b = logits.stride(0);
  P.logits_stride_k = logits.stride(1);
  P.draft_ids = ids.const_data_ptr<int64_t>();
  P.B = B;
  P.K = K;
  P.V = V;
  if (draft_probs.has_value())
    L.probs_dtype = draft_probs_arg(*draft_probs, target_logits, B, K, "K", V, L.keep_alive, P.draft_probs,
                                    P.probs_stride_b, P.probs_stride_k);
  P.temperature = per_row_temperature(temperature, target_logits, B, L.keep_alive);
  P.rnd = randomness(seed, offset, target_logits, B, L.keep_alive);
  P.filters = row_filters(filters, target_logits, B, V, L.keep_alive, checks);
  if (num_drafts.has_value()) {
    const at::Tensor& n = *num_drafts;
    TORCH_CHECK_TYPE(args::is_index_dtype(n), "num_drafts must be an int64 or int32 tensor, got ", n.scalar_type());
    TORCH_CHECK_VALUE(n.dim() == 1 && n.size(0) == B, "num_drafts must be [B] = [", B, "], got shape ", n.sizes());
    args::check_device_or_host(n, target_logits, "num_drafts", "target_logits");
    if (host_checked(n, checks))
      for (int64_t k : host_values<int64_t>(n))
        TORCH_CHECK_VALUE(k >= 0 && k <= K, "num_drafts values must be in [0, K = ", K, "], got ", k);
    at::Tensor c = n.to(target_logits.device(), at::kLong, /*non_blocking=*/true);
    L.keep_alive.push_back(c);
    P.num_drafts = c.const_data_ptr<int64_t>();
    P.num_drafts_stride = c.stride(0);
  }
  P.coupled = coupled;
  P.logprobs = token_logprobs_arg(
      token_logprobs, {B, K + 1}, "[B, K+1]", target_logits,
      {args::named(target_logits, "target_logits"), args::named(draft_token_ids, "draft_token_ids"),
       args::named(draft_probs, "draft_probs"), args::named(temperature, "temperature"), args::named(seed, "seed"),
       args::named(offset, "offset"), args::named(filters.top_k, "top_k"), args::named(filters.top_p, "top_p"),
       args::named(filters.min_p, "min_p"), args::named(num_drafts, "num_drafts")});

  const auto long_opts = target_logits.options().dtype(at::kLong);
  L.tokens = at::empty({B, K + 1}, long_opts);
  L.num_accepted = at::empty({B}, long_opts);
  L.valid = at::empty({B}, target_logits.options().dtype(at::kBool));
  P.tokens = L.tokens.mutable_data_ptr<int64_t>();
  P.num_accepted = L.num_accepted.mutable_data_ptr<int64_t>();
  P.valid = L.valid.mutable_data_ptr<bool>();
  return L;
}

TreeVerifyLaunch prepare_verify_tree(const at::Tensor& target_logits, const at::Tensor& tree_token_ids,
                                     const at::Tensor& parents, const std::optional<at::Tensor>& draft_probs,
                                     const at::Tensor& temperature, const at::Tensor& seed,
                                     const at::Tensor& offset, int64_t depth, const SamplingFilters& filters,
                                     HostChecks checks) {
  TreeVerifyLaunch L;
  TreeVerifyParams& P = L.params;
  TORCH_CHECK_VALUE(target_logits.dim() == 3, "target_logits must be [B, N, V], got shape ", target_logits.sizes());
  L.logits_dtype = float_dtype(target_logits, "target_logits");
  const int64_t B = target_logits.size(0), N = target_logits.size(1), V = target_logits.size(2);
  TORCH_CHECK_VALUE(N >= 1, "target_logits must be [B, N, V] with N >= 1 tree nodes, got shape ",
                    target_logits.sizes());
  TORCH_CHECK_VALUE(V >= 1, "target_logits must have a vocabulary size V >= 1, got shape ", target_logits.sizes());
  TORCH_CHECK_VALUE(N <= kMaxPositions, "N must be <= 2^24, got ", N);
  TORCH_CHECK_VALUE(depth >= 0 && depth < N, "depth must be in [0, N - 1 = ", N - 1, "], got ", depth);
  TORCH_CHECK_VALUE(tree_token_ids.dim() == 2 && tree_token_ids.size(0) == B && tree_token_ids.size(1) == N,
                    "tree_token_ids must be [B, N] = [", B, ", ", N, "], got shape ", tree_token_ids.sizes());
  TORCH_CHECK_TYPE(args::is_index_dtype(tree_token_ids), "tree_token_ids must be int64 or int32, got ",
                   tree_token_ids.scalar_type());
  check_device(tree_token_ids, target_logits, "tree_token_ids", "target_logits");

  at::Tensor logits = unit_stride_last(target_logits);
  at::Tensor ids = tree_token_ids.to(at::kLong).contiguous();
  L.keep_alive = {logits, ids};
  P.logits = logits.const_data_ptr();
  P.logits_stride_b = logits.stride(0);
  P.logits_stride_n = logits.stride(1);
  P.token_ids = ids.const_data_ptr<int64_t>();
  P.B = B;
  P.N = N;
  P.V = V;
  P.depth = depth;
  tree_parents_arg(parents, target_logits, B, N, depth, checks, P, L.keep_alive);
  if (draft_probs.has_value())
    L.probs_dtype = draft_probs_arg(*draft_probs, target_logits, B, N, "N", V, L.keep_alive, P.draft_probs,
                                    P.probs_stride_b, P.probs_stride_n);
  P.temperature = per_row_temperature(temperature, target_logits, B, L.keep_alive);
  P.rnd = randomness(seed, offset, target_logits, B, L.keep_alive);
  P.filters = row_filters(filters, target_logits, B, V, L.keep_alive, checks);

  const auto long_opts = target_logits.options().dtype(at::kLong);
  L.tokens = at::empty({B, depth + 1}, long_opts);
  L.path = at::empty({B, depth + 1}, long_opts);
  L.num_accepted = at::empty({B}, long_opts);
  L.valid = at::empty({B}, target_logits.options().dtype(at::kBool));
  P.tokens = L.tokens.mutable_data_ptr<int64_t>();
  P.path = L.path.mutable_data_ptr<int64_t>();
  P.num_accepted = L.num_accepted.mutable_data_ptr<int64_t>();
  P.valid = L.valid.mutable_data_ptr<bool>();
  return L;
}

namespace {

// The [B, V] rows, temperature and filters of sample / filtered_probs / mask_logits.
void sample_rows_arg(const at::Tensor& logits, const at::Tensor& temperature, const SamplingFilters& filters,
                     bool probs_input, HostChecks checks, SampleLaunch& L) {
  SampleParams& P = L.params;
  TORCH_CHECK_VALUE(logits.dim() == 2, "logits must be [B, V], got shape ", logits.sizes());
  L.logits_dtype = logits_dtype_arg(logits, "logits", probs_input);
  const int64_t B = logits.size(0), V = logits.size(1);
  TORCH_CHECK_VALUE(V >= 1, "logits must have a vocabulary size V >= 1, got shape ", logits.sizes());
  at::Tensor l = unit_stride_last(logits);
  L.keep_alive = {l};
  P.logits = l.const_data_ptr();
  P.logits_stride_b = l.stride(0);
  P.B = B;
  P.V = V;
  P.temperature = per_row_temperature(temperature, logits, B, L.keep_alive);
  P.filters = row_filters(filters, logits, B, V, L.keep_alive, checks);
}

}  // namespace

SampleLaunch prepare_filtered(const at::Tensor& logits, const at::Tensor& temperature, const SamplingFilters& filters,
                              bool probs_input, FilteredOutput output, HostChecks checks) {
  SampleLaunch L;
  sample_rows_arg(logits, temperature, filters, probs_input, checks, L);
  SampleParams& P = L.params;
  if (output == FilteredOutput::kProbs) {
    L.out = at::empty({P.B, P.V}, logits.options().dtype(at::kFloat));
    P.probs_out = L.out.mutable_data_ptr<float>();
    P.probs_stride_b = P.V;
  } else {
    L.out = at::empty({P.B, P.V}, logits.options());
    P.masked_out = L.out.mutable_data_ptr();
  }
  return L;
}

SampleLaunch prepare_sample(const at::Tensor& logits, const at::Tensor& temperature,
                            const at::Tensor& seed, const at::Tensor& offset,
                            const std::optional<at::Tensor>& probs_out, const SamplingFilters& filters,
                            bool probs_input, const TokenLogprobsArg& token_logprobs, HostChecks checks) {
  SampleLaunch L;
  sample_rows_arg(logits, temperature, filters, probs_input, checks, L);
  SampleParams& P = L.params;
  const int64_t B = P.B, V = P.V;
  P.rnd = randomness(seed, offset, logits, B, L.keep_alive);
  if (probs_out.has_value()) {
    const at::Tensor& o = *probs_out;
    TORCH_CHECK_TYPE(o.scalar_type() == at::kFloat, "probs_out must be float32, got ", o.scalar_type());
    TORCH_CHECK_VALUE(o.dim() == 2 && o.size(0) == B && o.size(1) == V, "probs_out must be [B, V] = [", B, ", ",
                      V, "], got shape ", o.sizes());
    check_device(o, logits, "probs_out", "logits");
    TORCH_CHECK_VALUE(V == 1 || o.stride(1) == 1, "probs_out must have stride 1 along V (a slice such as "
                      "draft_probs[:, i] is fine), got strides ", o.strides());
    TORCH_CHECK_VALUE(B <= 1 || o.stride(0) != 0, "probs_out rows must not overlap (stride 0 along B)");
    args::check_writes({args::named(o, "probs_out")},
                       {args::named(logits, "logits"), args::named(temperature, "temperature"),
                        args::named(seed, "seed"), args::named(offset, "offset"),
                        args::named(filters.top_k, "top_k"), args::named(filters.top_p, "top_p"),
                        args::named(filters.min_p, "min_p")});
    P.probs_out = o.mutable_data_ptr<float>();
    P.probs_stride_b = o.stride(0);
  }
  P.logprobs = token_logprobs_arg(
      token_logprobs, {B}, "[B]", logits,
      {args::named(logits, "logits"), args::named(temperature, "temperature"), args::named(seed, "seed"),
       args::named(offset, "offset"), args::named(filters.top_k, "top_k"), args::named(filters.top_p, "top_p"),
       args::named(filters.min_p, "min_p")},
      probs_out);
  L.tokens = at::empty({B}, logits.options().dtype(at::kLong));
  P.tokens = L.tokens.mutable_data_ptr<int64_t>();
  return L;
}

LogprobLaunch prepare_logprobs(const at::Tensor& logits, const at::Tensor& tokens, const at::Tensor& temperature,
                               const SamplingFilters& filters, int64_t num_top, bool processed, bool probs_input,
                               HostChecks checks) {
  LogprobLaunch L;
  LogprobParams& P = L.params;
  TORCH_CHECK_VALUE(logits.dim() == 3, "logits must be [B, P, V], got shape ", logits.sizes());
  L.logits_dtype = logits_dtype_arg(logits, "logits", probs_input);
  const int64_t B = logits.size(0), positions = logits.size(1), V = logits.size(2);
  TORCH_CHECK_VALUE(V >= 1, "logits must have a vocabulary size V >= 1, got shape ", logits.sizes());
  TORCH_CHECK_TYPE(args::is_index_dtype(tokens), "tokens must be int64 or int32, got ", tokens.scalar_type());
  TORCH_CHECK_VALUE(tokens.dim() == 2 && tokens.size(0) == B && tokens.size(1) == positions,
                    "tokens must be [B, P] = [", B, ", ", positions, "], got shape ", tokens.sizes());
  check_device(tokens, logits, "tokens", "logits");
  TORCH_CHECK_VALUE(num_top >= 0 && num_top <= kMaxTopLogprobs, "num_top must be in [0, ", kMaxTopLogprobs,
                    "], got ", num_top);
  at::Tensor l = unit_stride_last(logits);
  at::Tensor ids = tokens.to(at::kLong).contiguous();
  L.keep_alive = {l, ids};
  P.logits = l.const_data_ptr();
  P.stride_b = l.stride(0);
  P.stride_k = l.stride(1);
  P.B = B;
  P.positions = positions;
  P.V = V;
  P.tokens = ids.const_data_ptr<int64_t>();
  P.temperature = per_row_temperature(temperature, logits, B, L.keep_alive);
  P.filters = row_filters(filters, logits, B, V, L.keep_alive, checks);
  P.n = num_top;
  P.processed = processed;
  const auto opts = logits.options().dtype(at::kFloat);
  L.token_logprobs = at::empty({B, positions}, opts);
  L.token_ranks = at::empty({B, positions}, logits.options().dtype(at::kLong));
  L.top_ids = at::empty({B, positions, num_top}, logits.options().dtype(at::kLong));
  L.top_logprobs = at::empty({B, positions, num_top}, opts);
  P.token_logprobs = L.token_logprobs.mutable_data_ptr<float>();
  P.token_ranks = L.token_ranks.mutable_data_ptr<int64_t>();
  P.top_ids = L.top_ids.mutable_data_ptr<int64_t>();
  P.top_logprobs = L.top_logprobs.mutable_data_ptr<float>();
  return L;
}

void prepare_verify_shard(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                          const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                          const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                          const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                          int64_t rank, int64_t stage, at::TensorList gathered, bool cuda_kernels,
                          HostChecks checks) {
  L.verify = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, filters,
                            num_drafts, coupled, /*probs_input=*/false, TokenLogprobsArg{}, checks);
  const VerifyParams& P = L.verify.params;
  const int64_t n_bounds = static_cast<int64_t>(shard_bounds.size());
  TORCH_CHECK_VALUE(n_bounds >= 2, "shard_bounds must hold P + 1 >= 2 values, got ", shard_bounds);
  TORCH_CHECK_VALUE(shard_bounds[0] == 0, "shard_bounds must start at 0, got ", shard_bounds);
  for (int64_t r = 0; r + 1 < n_bounds; ++r)
    TORCH_CHECK_VALUE(shard_bounds[r] < shard_bounds[r + 1], "shard_bounds must be strictly increasing, got ",
                      shard_bounds);
  TORCH_CHECK_VALUE(shard_bounds[n_bounds - 1] < kMaxFilterVocab, "the vocabulary must hold fewer than 2^23 tokens, got ",
                    shard_bounds[n_bounds - 1]);
  const int64_t world = n_bounds - 1;
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "rank must be in [0, P = ", world, "), got ", rank);
  TORCH_CHECK_VALUE(shard_bounds[rank + 1] - shard_bounds[rank] == P.V, "target_logits holds V = ", P.V,
                    " tokens but shard_bounds give rank ", rank, " the tokens [", shard_bounds[rank], ", ",
                    shard_bounds[rank + 1], ")");
  L.bounds.assign(shard_bounds.begin(), shard_bounds.end());
  ShardParams& S = L.params;
  S.v = P;
  S.layout = ShardLayout{L.bounds.data(), world};
  S.rank = rank;
  ShardGathered& g = S.g;
  g.plan = ShardPlan::of(filters.top_k.has_value(), filters.top_p.has_value(), filters.min_p.has_value(),
                         cuda_kernels);
  g.K = P.K;
  const int steps = g.plan.n;
  TORCH_CHECK_VALUE(stage >= 0 && stage <= steps + 1, "stage must be in [0, ", steps + 1, "] (", steps,
                    " steps with these filters; ", steps + 1, " = finish), got ", stage);
  S.step = stage == 0 ? 0 : static_cast<int>(stage - 1);
  const int64_t need = stage == 0 ? 0 : (stage - 1) * world;
  TORCH_CHECK_VALUE(static_cast<int64_t>(gathered.size()) == need, "gathered must hold the outputs of steps 1..",
                    stage - 1, " of all P = ", world, " ranks (", need, " tensors) at stage ", stage, ", got ",
                    gathered.size());
  for (int s = 0; s < steps; ++s) g.width[s] = shard_step_width(g.plan.kind[s], S.layout, g.plan.pairs);
  for (int64_t k = 0; k < need; ++k) {
    const at::Tensor& t = gathered[k];
    const int s = static_cast<int>(k / world);
    const bool is_int = shard_step_is_int(g.plan.kind[s]);
    TORCH_CHECK_TYPE(t.scalar_type() == (is_int ? at::kLong : at::kDouble), "gathered[", k, "] (step ", s + 1,
                     ", rank ", k % world, ") must be ", is_int ? "int64" : "float64", ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 3 && t.size(0) == P.B && t.size(1) == P.K + 1 && t.size(2) == g.width[s],
                      "gathered[", k, "] (step ", s + 1, ", rank ", k % world, ") must be [B, K+1, ", g.width[s],
                      "] = [", P.B, ", ", P.K + 1, ", ", g.width[s], "], got shape ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), "gathered[", k, "] must be contiguous");
    args::check_device(t, target_logits, "gathered", "target_logits");
    L.gathered[s].push_back(t.const_data_ptr());
  }
  for (int s = 0; s < steps; ++s) g.step[s] = L.gathered[s].empty() ? nullptr : L.gathered[s].data();
  const auto opts = target_logits.options();
  if (stage == 0) {  // the number of steps
    L.out = at::empty({1}, opts.dtype(at::kLong).device(at::kCPU));
    L.out.mutable_data_ptr<int64_t>()[0] = steps;
  } else if (S.step < steps) {
    const ShardStep kind = g.plan.kind[S.step];
    L.out = at::empty({P.B, P.K + 1, g.width[S.step]}, opts.dtype(shard_step_is_int(kind) ? at::kLong : at::kDouble));
    S.out = L.out.mutable_data_ptr();
  }
}

void prepare_shard_step(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                        const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                        const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                        const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                        int64_t rank, int64_t stage, at::TensorList gathered, bool cuda_kernels, HostChecks checks) {
  prepare_verify_shard(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset, filters, num_drafts,
                       coupled, shard_bounds, rank, stage, gathered, cuda_kernels, checks);
  TORCH_CHECK_VALUE(L.params.step < L.params.g.plan.n || stage == 0, "stage ", stage,
                    " is verify_shard_finish's (the last step is ", L.params.g.plan.n, ")");
}

void prepare_shard_finish(ShardLaunch& L, const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                          const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
                          const at::Tensor& seed, const at::Tensor& offset, const SamplingFilters& filters,
                          const std::optional<at::Tensor>& num_drafts, bool coupled, at::IntArrayRef shard_bounds,
                          int64_t rank, at::TensorList gathered, bool cuda_kernels, HostChecks checks) {
  const int64_t world = static_cast<int64_t>(shard_bounds.size()) - 1;
  const int64_t stage = world > 0 ? static_cast<int64_t>(gathered.size()) / world + 1 : 1;
  prepare_verify_shard(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset, filters, num_drafts,
                       coupled, shard_bounds, rank, stage, gathered, cuda_kernels, checks);
  TORCH_CHECK_VALUE(L.params.step == L.params.g.plan.n, "gathered must hold the outputs of all ",
                    L.params.g.plan.n, " steps of all P = ", world, " ranks (", L.params.g.plan.n * world,
                    " tensors), got ", gathered.size());
}

}  // namespace specdec
