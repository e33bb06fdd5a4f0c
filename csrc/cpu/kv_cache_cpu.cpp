// CPU kernels of the KV-cache ops: the index tensors are read ONCE into a host
// snapshot, every row is validated on it (an invalid request raises ValueError
// and writes nothing), then rows of D elements are copied with memcpy under
// at::parallel_for using only the snapshot.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../kv_args.h"

namespace specdec {
namespace {

// Rows per parallel_for chunk: about 64 KiB of copies.
int64_t grain(int64_t row_bytes) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row_bytes, 1)); }

void kv_append_cpu(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                   const at::Tensor& new_v, const at::Tensor& lengths,
                   const std::optional<at::Tensor>& overflow) {
  kv::KVAppendLaunch L = kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow);
  KVAppendParams& P = L.p;
  const args::HostIndices len(P.lengths, P.B);
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = len[b];
    TORCH_CHECK_VALUE(n >= 0, "kv_append_: lengths[", b, "] = ", n, " is negative; nothing was written");
    TORCH_CHECK_VALUE(kv_append_fits(n, P.S, P.max_len), "kv_append_: row ", b, " holds ", n,
                      " tokens; appending S = ", P.S, " would exceed max_len = ", P.max_len,
                      " (cache overflow refused; nothing was written)");
  }
  if (P.S == 0 || P.row_bytes == 0) return;
  const int64_t rows = P.B * P.H * P.S;
  at::parallel_for(0, rows, grain(P.row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = r % P.S, h = (r / P.S) % P.H, b = r / (P.S * P.H);
      const int64_t pos = P.lengths.get(b) + s;
      for (int kv = 0; kv < 2; ++kv) std::memcpy(P.cache_row(kv, b, h, pos), P.src_row(kv, b, h, s), P.row_bytes);
    }
  });
}

void kv_rollback_cpu(at::Tensor& lengths, int64_t num_appended, const at::Tensor& num_kept,
                     const std::optional<at::Tensor>& invalid) {
  KVRollbackParams P = kv::prepare_kv_rollback(lengths, num_appended, num_kept, invalid);
  std::vector<int64_t> out(P.B);
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = P.lengths.get(b), k = P.num_kept.get(b);
    TORCH_CHECK_VALUE(k >= 0 && k <= num_appended, "kv_rollback_: num_kept[", b, "] = ", k,
                      " must be in [0, num_appended = ", num_appended,
                      "] (rolling forward is not allowed); nothing was written");
    TORCH_CHECK_VALUE(n >= 0, "kv_rollback_: lengths[", b, "] = ", n, " is negative; nothing was written");
    out[b] = kv_rollback_length(n, num_appended, k);
    TORCH_CHECK_VALUE(out[b] >= 0, "kv_rollback_: lengths[", b, "] = ", n, "; dropping num_appended - num_kept[",
                      b, "] = ", num_appended - k, " would make it negative; nothing was written");
  }
  for (int64_t b = 0; b < P.B; ++b) P.lengths.set(b, out[b]);
}

void paged_kv_append_cpu(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                         const at::Tensor& new_v, const at::Tensor& slot_mapping,
                         const std::optional<at::Tensor>& invalid) {
  kv::PagedAppendLaunch L = kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid);
  PagedAppendParams& P = L.p;
  const args::HostIndices slots(P.slots, P.T);
  const int64_t num_slots = P.num_slots();
  std::vector<int64_t> used;
  used.reserve(P.T);
  for (int64_t t = 0; t < P.T; ++t) {
    const int64_t slot = slots[t];
    const SlotKind kind = classify_slot(slot, num_slots);
    TORCH_CHECK_VALUE(kind != SlotKind::kInvalid, "paged_kv_append_: slot_mapping[", t, "] = ", slot,
                      " is out of range [0, num_blocks * block_size = ", num_slots,
                      ") and is not -1 (padding); nothing was written");
    if (kind == SlotKind::kWrite) used.push_back(slot);
  }
  std::sort(used.begin(), used.end());
  const auto dup = std::adjacent_find(used.begin(), used.end());
  TORCH_CHECK_VALUE(dup == used.end(), "paged_kv_append_: slot ", (dup == used.end() ? 0 : *dup),
                    " appears more than once in slot_mapping; nothing was written");
  if (P.row_bytes == 0 || used.empty()) return;
  at::parallel_for(0, P.T * P.H, grain(P.row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r / P.H, h = r % P.H;
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const int64_t blk = slot / P.block_size, off = slot % P.block_size;
      for (int kv = 0; kv < 2; ++kv) std::memcpy(P.cache_row(kv, blk, off, h), P.src_row(kv, t, h), P.row_bytes);
    }
  });
}

// Snapshots lengths and block_tables, validates every row on the snapshot
// (raising before anything is written), then copies / zero-fills.
void gather_cpu(PagedGatherParams P) {
  const args::HostIndices len(P.lengths, P.B);
  const args::HostIndices table(P.block_tables, P.B * P.max_blocks, [&](int64_t k) {
    return P.raw_table_entry(k / P.max_blocks, k % P.max_blocks);
  });
  P.table_stride_b = P.max_blocks;
  const int64_t capacity = P.table_capacity();
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = len[b];
    TORCH_CHECK_VALUE(n >= 0 && n <= P.max_len, "paged_kv_gather: lengths[", b, "] = ", n,
                      " must be in [0, max_len = ", P.max_len, "]");
    TORCH_CHECK_VALUE(n <= capacity, "paged_kv_gather: lengths[", b, "] = ", n,
                      " exceeds what block_tables can address (max_blocks_per_seq * block_size = ", capacity, ")");
    for (int64_t p = 0; p < n; p += P.block_size) {
      TORCH_CHECK_VALUE(P.block_of(b, p) >= 0, "paged_kv_gather: block_tables[", b, ", ", p / P.block_size,
                        "] is out of range [0, num_blocks = ", P.num_blocks, ") but row ", b, " uses it (length ",
                        n, ")");
    }
  }
  if (P.B * P.H * P.max_len == 0 || P.row_bytes == 0) return;
  at::parallel_for(0, P.B * P.H * P.max_len, grain(P.row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r % P.max_len, h = (r / P.max_len) % P.H, b = r / (P.max_len * P.H);
      const int64_t blk = p < P.clamped_length(b) ? P.block_of(b, p) : -1;
      for (int kv = 0; kv < 2; ++kv) {
        char* dst = P.out_row(kv, b, h, p);
        if (blk < 0) std::memset(dst, 0, P.row_bytes);
        else std::memcpy(dst, P.cache_row(kv, blk, p % P.block_size, h), P.row_bytes);
      }
    }
  });
}

void paged_kv_gather_into_cpu(const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                              at::Tensor& values_out) {
  gather_cpu(kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, keys_out, values_out));
}

std::tuple<at::Tensor, at::Tensor> paged_kv_gather_cpu(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                       const at::Tensor& block_tables, const at::Tensor& lengths,
                                                       int64_t max_len) {
  return kv::gather_by_allocating(key_cache, value_cache, block_tables, lengths, max_len, &paged_kv_gather_into_cpu);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("kv_append_", &kv_append_cpu);
  m.impl("kv_rollback_", &kv_rollback_cpu);
  m.impl("paged_kv_append_", &paged_kv_append_cpu);
  m.impl("paged_kv_gather", &paged_kv_gather_cpu);
  m.impl("paged_kv_gather_into_", &paged_kv_gather_into_cpu);
}

}  // namespace specdec
