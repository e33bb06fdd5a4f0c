// Argument checking shared by every op (sampling_args.cpp, kv_args.h, the
// device guard in ops.cpp): one rule per concept, header-only.
//
// Error policy: every argument error is raised before anything is written and
// names the argument. A bad value, shape, device, range or aliasing is a
// ValueError (TORCH_CHECK_VALUE); a wrong dtype is a TypeError
// (TORCH_CHECK_TYPE). Device-side problems found by CUDA kernels are reported
// through the ops' sticky flag tensors instead (no host sync).
#pragma once
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "../core/kv_cache.h"
#include "../core/sampling_params.h"

namespace specdec::args {

// ---- devices ------------------------------------------------------------------
// Every tensor argument lives on the op's device: the device of its main data
// tensor (`ref`).
inline void check_device(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " is on ", t.device(), " but ", ref_name, " is on ",
                    ref.device(), ": all tensors must be on one device");
}

// The one exception: the per-row scalars of the sampling ops (temperature,
// seed, offset) may also be CPU tensors when the data is on an accelerator. A
// 0-dim one is read on the host; a [B] one is copied to the device without a
// host sync (non_blocking). Meta or any other device is refused.
// (With meta data, which only the fake kernels see, CPU scalars are harmless.)
inline bool host_scalar_allowed(const at::Tensor& t, const at::Tensor& ref) {
  return t.device().is_cpu() && !ref.device().is_cpu();
}
inline void check_device_or_host(const at::Tensor& t, const at::Tensor& ref, const char* name,
                                 const char* ref_name) {
  if (ref.device().is_cpu()) return check_device(t, ref, name, ref_name);
  TORCH_CHECK_VALUE(t.device() == ref.device() || host_scalar_allowed(t, ref), name, " is on ", t.device(),
                    " but ", ref_name, " is on ", ref.device(), ": it must be on the device of ", ref_name,
                    " or a CPU tensor");
}

// ---- dtypes ---------------------------------------------------------------------
// float32 / float16 / bfloat16 (logits, draft probabilities, KV caches).
inline DType float_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  return DType::kFloat32;
}

inline bool is_index_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt;
}
inline void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(is_index_dtype(t), name, " must be int32 or int64, got ", t.scalar_type());
}

inline void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), name, " has dtype ", t.scalar_type(), " but ", ref_name,
                   " has ", ref.scalar_type(), ": they must match");
}

// ---- layout ---------------------------------------------------------------------
// The last dim (vocabulary / head dim) with stride 1: the tensor itself, else a
// contiguous copy (read-only inputs only).
inline at::Tensor unit_stride_last(const at::Tensor& t) {
  return (t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

// ---- index vectors ----------------------------------------------------------------
// An int32 / int64 [n] index vector on ref's device. The pointer is for reading;
// ops that write one (kv_rollback_'s lengths) take it from the tensor.
inline IndexVec index_vec(const at::Tensor& t, int64_t n, const at::Tensor& ref, const char* name,
                          const char* n_name) {
  check_index_dtype(t, name);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, name, " must have shape [", n_name, "] = [", n,
                    "], got shape ", t.sizes());
  check_device(t, ref, name, "the cache");
  IndexVec v;
  v.ptr = const_cast<void*>(t.const_data_ptr());
  v.stride = t.stride(0);
  v.is64 = t.scalar_type() == at::kLong;
  return v;
}

// The values of an index vector read ONCE on the host: the CPU kernels validate
// and then use only this snapshot (the IndexVec is re-pointed at it), so a
// tensor that changes while the op runs cannot make them use an unchecked value.
class HostIndices {
 public:
  HostIndices(IndexVec& v, int64_t n) : HostIndices(v, n, [&v](int64_t i) { return v.get(i); }) {}
  // Entry i = read(i) (e.g. a 2-D table flattened row by row).
  template <typename Read>
  HostIndices(IndexVec& v, int64_t n, Read read) : values_(static_cast<size_t>(n)) {
    for (int64_t i = 0; i < n; ++i) values_[static_cast<size_t>(i)] = read(i);
    v.ptr = values_.data();
    v.stride = 1;
    v.is64 = true;
  }
  // A [rows, cols] matrix, flattened row by row (m is re-pointed at the snapshot).
  HostIndices(IndexMat& m, int64_t rows, int64_t cols)
      : HostIndices(m.cols, rows * cols, [&m, cols](int64_t k) { return m.get(k / cols, k % cols); }) {
    m.row_stride = cols;
  }
  HostIndices(const HostIndices&) = delete;
  HostIndices& operator=(const HostIndices&) = delete;
  int64_t operator[](int64_t i) const { return values_[static_cast<size_t>(i)]; }

 private:
  std::vector<int64_t> values_;
};

// ---- memory overlap ------------------------------------------------------------------
// Conservative and cheap (metadata only): two tensors may alias when the byte
// ranges [lowest byte, highest byte] they can touch intersect (refined only for
// two views of one geometry, see may_overlap); a written tensor must have no
// internal overlap. torch's exact answers (at::get_overlap_status) give up on
// non-dense views and as_strided, which is exactly where aliasing hides.

struct ByteRange {
  uintptr_t lo = 0, hi = 0;  // [lo, hi)
};

// The bytes a tensor can touch; false when it touches none (empty, or no data: meta).
inline bool byte_range(const at::Tensor& t, ByteRange& r) {
  if (t.numel() == 0 || t.is_meta() || !t.has_storage() || t.const_data_ptr() == nullptr) return false;
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = t.stride(d) * (t.size(d) - 1);
    (span < 0 ? lo : hi) += span;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const int64_t es = static_cast<int64_t>(t.element_size());
  r.lo = base + static_cast<uintptr_t>(lo * es);
  r.hi = base + static_cast<uintptr_t>((hi + 1) * es);
  return true;
}

// Dims of size > 1 as (stride, size), sorted by stride; true when they are
// nested: each stride at least the extent (max offset + 1) of the smaller ones.
// Nested dims never map two indices to one element.
inline bool nested_dims(const at::Tensor& t, std::vector<std::pair<int64_t, int64_t>>& dims) {
  dims.clear();
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent += stride * (size - 1);
  }
  return true;
}

// No two elements share memory (else only torch's exact "No", for dense tensors).
inline bool no_internal_overlap(const at::Tensor& t) {
  if (t.numel() <= 1) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;
  return nested_dims(t, dims) || at::has_internal_overlap(t) == at::MemOverlap::No;
}

// Is delta = sum_i stride_i * d_i with |d_i| < size_i over dims [0, k)? With
// nested dims what is left after dim k-1 is smaller than its stride in
// magnitude, so d_{k-1} is the floor or the ceiling of delta / stride.
inline bool lattice_hit(int64_t delta, const std::vector<std::pair<int64_t, int64_t>>& dims, size_t k) {
  if (k == 0) return delta == 0;
  const auto [stride, size] = dims[k - 1];
  int64_t lo = delta / stride;  // truncates toward zero: make it the floor
  if (lo * stride > delta) --lo;
  for (int64_t d : {lo, lo + 1})
    if (d > -size && d < size && lattice_hit(delta - d * stride, dims, k - 1)) return true;
  return false;
}

// Two tensors may share a byte. Exact for two views of one geometry (same
// dtype, sizes and nested strides: e.g. the key / value halves kv[:, 0] and
// kv[:, 1] of one interleaved buffer); otherwise any intersection of the byte
// ranges counts as an overlap.
inline bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.device() != b.device()) return false;  // separate memories (a host scalar vs device data)
  ByteRange ra, rb;
  if (!byte_range(a, ra) || !byte_range(b, rb)) return false;
  if (!(ra.lo < rb.hi && rb.lo < ra.hi)) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes() || a.strides() != b.strides() ||
      !nested_dims(a, dims))
    return true;
  const int64_t es = static_cast<int64_t>(a.element_size());
  const int64_t delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.const_data_ptr()) -
                                             reinterpret_cast<uintptr_t>(a.const_data_ptr()));
  if (delta % es != 0) return true;  // elements straddle each other
  return lattice_hit(delta / es, dims, dims.size());
}

struct Named {
  const at::Tensor* t;  // nullptr: an absent optional argument
  const char* name;
};
inline Named named(const at::Tensor& t, const char* name) { return Named{&t, name}; }
inline Named named(const std::optional<at::Tensor>& t, const char* name) {
  return Named{t.has_value() ? &*t : nullptr, name};
}

// Every tensor the op writes: no internal overlap, and no byte shared with any
// other written tensor or with any tensor argument it reads (indices, flags,
// sources). Read-only arguments may alias each other.
inline void check_writes(std::initializer_list<Named> written, std::initializer_list<Named> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    if (!w->t) continue;
    TORCH_CHECK_VALUE(no_internal_overlap(*w->t), w->name,
                      " has overlapping elements (e.g. an expanded or as_strided tensor); a tensor the op "
                      "writes must be writable element by element");
    for (auto o = w + 1; o != written.end(); ++o)
      if (o->t)
        TORCH_CHECK_VALUE(!may_overlap(*w->t, *o->t), w->name, " and ", o->name,
                          " overlap in memory; they must be different tensors (no shared bytes)");
    for (const Named& r : read)
      if (r.t)
        TORCH_CHECK_VALUE(!may_overlap(*w->t, *r.t), w->name, " and ", r.name,
                          " overlap in memory; the op writes ", w->name, ", so they must not share bytes");
  }
}

}  // namespace specdec::args
