// Tensor-facing argument handling of the KV-cache ops, shared by the CPU and
// CUDA launchers: every user error is raised (args/common.h: ValueError /
// TypeError) naming the argument, before anything is written, and the result is
// a byte-addressed parameter block (core/kv_cache.h). Header-only: it is
// included by csrc/cpu/kv_cache_cpu.cpp and csrc/cuda/kv_cache_cuda.cu.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "args/common.h"
#include "core/kv_cache.h"

namespace specdec {
namespace kv {

using args::check_device;
using args::index_vec;

// Optional sticky bool flags (written by CUDA kernels only) of `numel` elements.
inline bool* flag_ptr(const std::optional<at::Tensor>& f, int64_t numel, const at::Tensor& ref,
                      const char* name, const char* shape, int64_t* stride) {
  if (!f.has_value()) return nullptr;
  const at::Tensor& t = *f;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kBool, name, " must be a bool tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == numel && t.dim() <= 1, name, " must have shape ", shape, ", got shape ",
                    t.sizes());
  check_device(t, ref, name, "the cache");
  if (stride) *stride = t.dim() == 1 ? t.stride(0) : 1;
  return t.mutable_data_ptr<bool>();
}

// key_cache and value_cache: same dtype / shape / device, head dim contiguous.
// Whether they may share memory is the op's business: written caches are checked
// by args::check_writes, read-only ones (paged_kv_gather) may alias freely.
inline void check_cache_pair(const at::Tensor& k, const at::Tensor& v, int64_t dims, const char* layout) {
  TORCH_CHECK_VALUE(k.dim() == dims, "key_cache must be ", layout, ", got shape ", k.sizes());
  TORCH_CHECK_VALUE(v.dim() == dims, "value_cache must be ", layout, ", got shape ", v.sizes());
  args::float_dtype(k, "key_cache");
  args::check_same_dtype(v, k, "value_cache", "key_cache");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "value_cache has shape ", v.sizes(), " but key_cache has ", k.sizes(),
                    ": they must match");
  check_device(v, k, "value_cache", "key_cache");
  TORCH_CHECK_VALUE(k.size(dims - 1) <= 1 || k.stride(dims - 1) == 1,
                    "key_cache must have stride 1 in its last (head_dim) dim, got strides ", k.strides());
  TORCH_CHECK_VALUE(v.size(dims - 1) <= 1 || v.stride(dims - 1) == 1,
                    "value_cache must have stride 1 in its last (head_dim) dim, got strides ", v.strides());
}

// New keys / values: the cache's dtype and device (no implicit cast), given shape.
inline at::Tensor check_new(const at::Tensor& t, const at::Tensor& cache, at::IntArrayRef shape,
                            const char* name, const char* cache_name, const char* layout) {
  TORCH_CHECK_TYPE(t.scalar_type() == cache.scalar_type(), name, " has dtype ", t.scalar_type(), " but ",
                   cache_name, " has ", cache.scalar_type(), ": cast it first (", name, ".to(", cache_name,
                   ".dtype)); the op never converts");
  TORCH_CHECK_VALUE(t.sizes() == shape, name, " must be ", layout, " = ", shape, ", got shape ", t.sizes());
  check_device(t, cache, name, cache_name);
  return args::unit_stride_last(t);
}

// Data pointers (nullptr when empty) and byte strides of the first N dims of a
// (key, value) pair of tensors. Ptr = const char* for tensors the op only reads.
template <typename Ptr, size_t N>
void pair_layout(const at::Tensor& k, const at::Tensor& v, Ptr (&ptr)[2], int64_t (&stride)[2][N]) {
  const at::Tensor* t[2] = {&k, &v};
  for (int i = 0; i < 2; ++i) {
    if constexpr (std::is_const_v<std::remove_pointer_t<Ptr>>)
      ptr[i] = static_cast<Ptr>(t[i]->numel() ? t[i]->const_data_ptr() : nullptr);
    else
      ptr[i] = static_cast<Ptr>(t[i]->numel() ? t[i]->data_ptr() : nullptr);
    for (size_t d = 0; d < N; ++d) stride[i][d] = t[i]->stride(d) * static_cast<int64_t>(t[i]->element_size());
  }
}

// new_k / new_v checked against their caches (check_new); their layout goes to src / src_stride
// and the tensors (a contiguous copy if the head dim was strided) to keep.
template <size_t N>
void set_new_pair(const at::Tensor& new_k, const at::Tensor& new_v, const at::Tensor& key_cache,
                  const at::Tensor& value_cache, at::IntArrayRef shape, const char* layout, const char* (&src)[2],
                  int64_t (&src_stride)[2][N], std::vector<at::Tensor>& keep) {
  keep = {check_new(new_k, key_cache, shape, "new_k", "key_cache", layout),
          check_new(new_v, value_cache, shape, "new_v", "value_cache", layout)};
  pair_layout(keep[0], keep[1], src, src_stride);
}

// A parameter block and the converted inputs it points into.
template <typename Params>
struct Launch {
  Params p;
  std::vector<at::Tensor> keep_alive;
};
using KVAppendLaunch = Launch<KVAppendParams>;

// kv_append_(key_cache [B,H,M,D], value_cache, new_k [B,H,S,D], new_v, lengths [B], overflow? [B])
inline KVAppendLaunch prepare_kv_append(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                        const at::Tensor& new_k, const at::Tensor& new_v,
                                        const at::Tensor& lengths, const std::optional<at::Tensor>& overflow) {
  check_cache_pair(key_cache, value_cache, 4, "[B, H, max_len, D]");
  const int64_t B = key_cache.size(0), H = key_cache.size(1), M = key_cache.size(2), D = key_cache.size(3);
  TORCH_CHECK_VALUE(new_k.dim() == 4, "new_k must be [B, H, S, D], got shape ", new_k.sizes());
  const int64_t S = new_k.size(2);
  KVAppendLaunch L;
  KVAppendParams& P = L.p;
  set_new_pair(new_k, new_v, key_cache, value_cache, {B, H, S, D}, "[B, H, S, D]", P.src, P.src_stride,
               L.keep_alive);
  P.lengths = index_vec(lengths, B, key_cache, "lengths", "B");
  P.overflow = flag_ptr(overflow, B, key_cache, "overflow", "[B]", &P.overflow_stride);
  args::check_writes({args::named(key_cache, "key_cache"), args::named(value_cache, "value_cache"),
                      args::named(overflow, "overflow")},
                     {args::named(new_k, "new_k"), args::named(new_v, "new_v"), args::named(lengths, "lengths")});
  pair_layout(key_cache, value_cache, P.cache, P.cache_stride);
  P.B = B;
  P.H = H;
  P.S = S;
  P.max_len = M;
  P.row_bytes = D * static_cast<int64_t>(key_cache.element_size());
  return L;
}

// kv_rollback_(lengths [B], num_appended, num_kept [B], invalid? [B])
inline KVRollbackParams prepare_kv_rollback(const at::Tensor& lengths, int64_t num_appended,
                                            const at::Tensor& num_kept,
                                            const std::optional<at::Tensor>& invalid) {
  TORCH_CHECK_VALUE(lengths.dim() == 1, "lengths must have shape [B], got shape ", lengths.sizes());
  const int64_t B = lengths.size(0);
  TORCH_CHECK_VALUE(num_appended >= 0, "num_appended must be >= 0, got ", num_appended);
  KVRollbackParams P;
  P.lengths = index_vec(lengths, B, lengths, "lengths", "B");
  P.lengths.ptr = B ? lengths.data_ptr() : nullptr;
  P.num_kept = index_vec(num_kept, B, lengths, "num_kept", "B");
  P.invalid = flag_ptr(invalid, B, lengths, "invalid", "[B]", &P.invalid_stride);
  args::check_writes({args::named(lengths, "lengths"), args::named(invalid, "invalid")},
                     {args::named(num_kept, "num_kept")});
  P.B = B;
  P.num_appended = num_appended;
  return P;
}

using PagedAppendLaunch = Launch<PagedAppendParams>;

// paged_kv_append_(key_cache [NB,BS,H,D], value_cache, new_k [T,H,D], new_v, slot_mapping [T], invalid? [])
inline PagedAppendLaunch prepare_paged_append(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                              const at::Tensor& new_k, const at::Tensor& new_v,
                                              const at::Tensor& slot_mapping,
                                              const std::optional<at::Tensor>& invalid) {
  check_cache_pair(key_cache, value_cache, 4, "[num_blocks, block_size, H, D]");
  const int64_t NB = key_cache.size(0), BS = key_cache.size(1), H = key_cache.size(2), D = key_cache.size(3);
  TORCH_CHECK_VALUE(BS >= 1, "key_cache must have block_size >= 1, got shape ", key_cache.sizes());
  TORCH_CHECK_VALUE(new_k.dim() == 3, "new_k must be [T, H, D], got shape ", new_k.sizes());
  const int64_t T = new_k.size(0);
  PagedAppendLaunch L;
  PagedAppendParams& P = L.p;
  set_new_pair(new_k, new_v, key_cache, value_cache, {T, H, D}, "[T, H, D]", P.src, P.src_stride, L.keep_alive);
  P.slots = index_vec(slot_mapping, T, key_cache, "slot_mapping", "T");
  P.invalid = flag_ptr(invalid, 1, key_cache, "invalid", "[] (one element)", nullptr);
  args::check_writes({args::named(key_cache, "key_cache"), args::named(value_cache, "value_cache"),
                      args::named(invalid, "invalid")},
                     {args::named(new_k, "new_k"), args::named(new_v, "new_v"),
                      args::named(slot_mapping, "slot_mapping")});
  pair_layout(key_cache, value_cache, P.cache, P.cache_stride);
  P.T = T;
  P.H = H;
  P.block_size = BS;
  P.num_blocks = NB;
  P.row_bytes = D * static_cast<int64_t>(key_cache.element_size());
  return L;
}

// An int32 / int64 [rows, N] index matrix on the cache's device (`layout` names its dims);
// rows < 0: any number of rows.
inline IndexMat index_mat(const at::Tensor& t, int64_t rows, const at::Tensor& cache, const char* name,
                          const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == 2, name, " must be ", layout, ", got shape ", t.sizes());
  TORCH_CHECK_VALUE(rows < 0 || t.size(0) == rows, name, " must be ", layout, " with B = ", rows,
                    " rows, got shape ", t.sizes());
  args::check_index_dtype(t, name);
  check_device(t, cache, name, "key_cache");
  IndexMat m;
  m.cols.ptr = const_cast<void*>(t.const_data_ptr());
  m.cols.stride = t.stride(1);
  m.cols.is64 = t.scalar_type() == at::kLong;
  m.row_stride = t.stride(0);
  return m;
}

// block_tables [B, max_blocks_per_seq] of a paged cache [num_blocks, block_size, H, D] (B: its rows).
inline BlockTable block_table(const at::Tensor& block_tables, const at::Tensor& key_cache) {
  TORCH_CHECK_VALUE(key_cache.size(1) >= 1, "key_cache must have block_size >= 1, got shape ", key_cache.sizes());
  BlockTable T;
  T.entries = index_mat(block_tables, -1, key_cache, "block_tables", "[B, max_blocks_per_seq]");
  T.max_blocks = block_tables.size(1);
  T.block_size = key_cache.size(1);
  T.num_blocks = key_cache.size(0);
  return T;
}

// paged_kv_gather(key_cache [NB,BS,H,D], value_cache, block_tables [B,MB], lengths [B], max_len)
// The outputs are allocated by the backend launcher; their pointers are set there.
inline PagedGatherParams prepare_paged_gather(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                              const at::Tensor& block_tables, const at::Tensor& lengths,
                                              int64_t max_len) {
  check_cache_pair(key_cache, value_cache, 4, "[num_blocks, block_size, H, D]");
  TORCH_CHECK_VALUE(max_len >= 0, "max_len must be >= 0, got ", max_len);
  PagedGatherParams P;
  P.table = block_table(block_tables, key_cache);
  const int64_t B = block_tables.size(0);
  P.lengths = index_vec(lengths, B, key_cache, "lengths", "B (rows of block_tables)");
  pair_layout(key_cache, value_cache, P.cache, P.cache_stride);
  P.B = B;
  P.H = key_cache.size(2);
  P.max_len = max_len;
  P.row_bytes = key_cache.size(3) * static_cast<int64_t>(key_cache.element_size());
  return P;
}

// The per-row arguments of kv_compact_ / paged_kv_compact_ (lengths [B], src_index [B, P],
// count [B], invalid? [B]) and the caches' layout as blocks (strides of `blocks`, the caches
// viewed [blocks, block_size, H, D]); the caches share no byte with anything else.
inline void set_compact_rows(KVCompactParams& P, const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& key_blocks, const at::Tensor& value_blocks, const at::Tensor& lengths,
                             const at::Tensor& src_index, const at::Tensor& count,
                             const std::optional<at::Tensor>& invalid, const at::Tensor* block_tables) {
  const char* b_name = block_tables ? "B (rows of block_tables)" : "B";
  P.lengths = index_vec(lengths, P.B, key_cache, "lengths", b_name);
  P.src = index_mat(src_index, P.B, key_cache, "src_index", "[B, P]");
  P.count = index_vec(count, P.B, key_cache, "count", b_name);
  P.invalid = flag_ptr(invalid, P.B, key_cache, "invalid", "[B]", &P.invalid_stride);
  const args::Named tables = block_tables ? args::named(*block_tables, "block_tables") : args::Named{nullptr, ""};
  args::check_writes({args::named(key_cache, "key_cache"), args::named(value_cache, "value_cache"),
                      args::named(invalid, "invalid")},
                     {args::named(lengths, "lengths"), args::named(src_index, "src_index"),
                      args::named(count, "count"), tables});
  pair_layout(key_blocks, value_blocks, P.cache, P.cache_stride);
  P.H = key_blocks.size(2);
  P.P = src_index.size(1);
  P.row_bytes = key_cache.size(3) * static_cast<int64_t>(key_cache.element_size());
}

// kv_compact_(key_cache [B,H,M,D], value_cache, lengths [B], src_index [B,P], count [B], invalid? [B])
inline KVCompactParams prepare_kv_compact(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                          const at::Tensor& lengths, const at::Tensor& src_index,
                                          const at::Tensor& count, const std::optional<at::Tensor>& invalid) {
  check_cache_pair(key_cache, value_cache, 4, "[B, H, max_len, D]");
  KVCompactParams P;
  P.B = key_cache.size(0);
  P.table.block_size = key_cache.size(2);  // row b = block b of max_len positions
  P.table.num_blocks = P.B;
  // [B, max_len, H, D]: the (block, offset, h) strides
  set_compact_rows(P, key_cache, value_cache, key_cache.transpose(1, 2), value_cache.transpose(1, 2), lengths,
                   src_index, count, invalid, nullptr);
  return P;
}

// paged_kv_compact_(key_cache [NB,BS,H,D], value_cache, block_tables [B,MB], lengths [B], src_index [B,P],
// count [B], invalid? [B])
inline KVCompactParams prepare_paged_compact(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                             const at::Tensor& block_tables, const at::Tensor& lengths,
                                             const at::Tensor& src_index, const at::Tensor& count,
                                             const std::optional<at::Tensor>& invalid) {
  check_cache_pair(key_cache, value_cache, 4, "[num_blocks, block_size, H, D]");
  KVCompactParams P;
  P.paged = true;
  P.table = block_table(block_tables, key_cache);
  P.B = block_tables.size(0);
  set_compact_rows(P, key_cache, value_cache, key_cache, value_cache, lengths, src_index, count, invalid,
                   &block_tables);
  return P;
}

// paged_kv_gather's outputs {keys, values} [B, H, max_len, D] (cache dtype, contiguous), for
// paged_kv_gather_into_ to fill, so each backend has one gather path. Argument errors are
// raised by prepare_paged_gather before anything is allocated.
inline std::vector<at::Tensor> allocate_gather_outputs(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                       const at::Tensor& block_tables, const at::Tensor& lengths,
                                                       int64_t max_len) {
  const PagedGatherParams P = prepare_paged_gather(key_cache, value_cache, block_tables, lengths, max_len);
  return {at::empty({P.B, P.H, max_len, key_cache.size(3)}, key_cache.options()),
          at::empty({P.B, P.H, max_len, value_cache.size(3)}, value_cache.options())};
}

// Gather outputs keys / values [B, H, max_len, D]: the cache's dtype and device, head dim
// contiguous, sharing no byte with each other or with any input.
inline void set_gather_outputs(PagedGatherParams& P, const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, const at::Tensor& keys,
                               const at::Tensor& values) {
  const std::vector<int64_t> shape{P.B, P.H, P.max_len, key_cache.size(3)};
  const at::Tensor* outs[2] = {&keys, &values};
  const char* names[2] = {"keys_out", "values_out"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& o = *outs[i];
    TORCH_CHECK_TYPE(o.scalar_type() == key_cache.scalar_type(), names[i], " has dtype ", o.scalar_type(),
                     " but the cache has ", key_cache.scalar_type(), ": they must match");
    TORCH_CHECK_VALUE(o.sizes() == at::IntArrayRef(shape), names[i], " must be [B, H, max_len, D] = ", shape,
                      ", got shape ", o.sizes());
    check_device(o, key_cache, names[i], "key_cache");
    TORCH_CHECK_VALUE(o.size(3) <= 1 || o.stride(3) == 1, names[i],
                      " must have stride 1 in its last (head_dim) dim, got strides ", o.strides());
  }
  pair_layout(keys, values, P.out, P.out_stride);
  args::check_writes({args::named(keys, "keys_out"), args::named(values, "values_out")},
                     {args::named(key_cache, "key_cache"), args::named(value_cache, "value_cache"),
                      args::named(block_tables, "block_tables"), args::named(lengths, "lengths")});
}

// paged_kv_gather_into_(key_cache, value_cache, block_tables, lengths, keys_out [B,H,max_len,D], values_out)
inline PagedGatherParams prepare_paged_gather_into(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                   const at::Tensor& block_tables, const at::Tensor& lengths,
                                                   const at::Tensor& keys_out, const at::Tensor& values_out) {
  TORCH_CHECK_VALUE(keys_out.dim() == 4, "keys_out must be [B, H, max_len, D], got shape ", keys_out.sizes());
  PagedGatherParams P = prepare_paged_gather(key_cache, value_cache, block_tables, lengths, keys_out.size(2));
  set_gather_outputs(P, key_cache, value_cache, block_tables, lengths, keys_out, values_out);
  return P;
}

}  // namespace kv
}  // namespace specdec
