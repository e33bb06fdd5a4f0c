// CPU kernels of the KV-cache ops: the index tensors are read ONCE into a host
// snapshot, every row is validated on it (an invalid request raises ValueError
// and writes nothing), then rows of D elements are copied with memcpy under
// at::parallel_for using only the snapshot. The ops are adapters (op_adapters.h) on the CPU
// backend (cpu_backend.h); the kernels are found by argument-dependent lookup in specdec::cpu
// (hence static there, not in an unnamed namespace).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../kv_args.h"
#include "../op_adapters.h"
#include "cpu_backend.h"

namespace specdec::cpu {

// Rows per parallel_for chunk: about 64 KiB of copies.
static int64_t grain(int64_t row_bytes) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row_bytes, 1)); }

static void kv_append_kernel(Cpu, KVAppendParams& P) {
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

static void kv_rollback_kernel(Cpu, KVRollbackParams& P) {
  const int64_t num_appended = P.num_appended;
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

static void paged_append_kernel(Cpu, PagedAppendParams& P) {
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
static void paged_gather_kernel(Cpu, PagedGatherParams& P) {
  const args::HostIndices len(P.lengths, P.B);
  const args::HostIndices table(P.table.entries, P.B, P.table.max_blocks);
  const int64_t capacity = P.table.capacity();
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = len[b];
    TORCH_CHECK_VALUE(n >= 0 && n <= P.max_len, "paged_kv_gather: lengths[", b, "] = ", n,
                      " must be in [0, max_len = ", P.max_len, "]");
    TORCH_CHECK_VALUE(n <= capacity, "paged_kv_gather: lengths[", b, "] = ", n,
                      " exceeds what block_tables can address (max_blocks_per_seq * block_size = ", capacity, ")");
    for (int64_t p = 0; p < n; p += P.table.block_size) {
      TORCH_CHECK_VALUE(P.table.block_of(b, p) >= 0, "paged_kv_gather: block_tables[", b, ", ",
                        p / P.table.block_size, "] is out of range [0, num_blocks = ", P.table.num_blocks,
                        ") but row ", b, " uses it (length ", n, ")");
    }
  }
  if (P.B * P.H * P.max_len == 0 || P.row_bytes == 0) return;
  at::parallel_for(0, P.B * P.H * P.max_len, grain(P.row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r % P.max_len, h = (r / P.max_len) % P.H, b = r / (P.max_len * P.H);
      const int64_t blk = p < P.clamped_length(b) ? P.table.block_of(b, p) : -1;
      for (int kv = 0; kv < 2; ++kv) {
        char* dst = P.out_row(kv, b, h, p);
        if (blk < 0) std::memset(dst, 0, P.row_bytes);
        else std::memcpy(dst, P.cache_row(kv, blk, p % P.table.block_size, h), P.row_bytes);
      }
    }
  });
}

// Raises the error of a row that check_row refused, naming the argument (op: the op's name).
static void raise_compact_error(const KVCompactParams& P, const char* op, int64_t b, const CompactCheck& c) {
  const int64_t n = P.lengths.get(b), j = c.j;
  const bool has_src = c.error != CompactError::kLength && c.error != CompactError::kCount;
  const int64_t s = has_src ? P.src.get(b, j) : 0;
  const char* cap_name = P.paged ? "max_blocks_per_seq * block_size" : "max_len";
  std::string what;
  switch (c.error) {
    case CompactError::kLength:
      what = c10::str("lengths[", b, "] = ", n, " must be in [0, ", cap_name, " = ", P.capacity(), "]");
      break;
    case CompactError::kCount:
      what = c10::str("count[", b, "] = ", P.count.get(b), " must be in [0, P = ", P.P, "] (P: columns of src_index)");
      break;
    case CompactError::kOrder:
      what = j == 0 ? c10::str("src_index[", b, ", 0] = ", s, " is negative")
                    : c10::str("src_index[", b, ", ", j, "] = ", s, " must be greater than src_index[", b, ", ", j - 1,
                               "] = ", P.src.get(b, j - 1), " (src_index[b, :count[b]] must be strictly increasing)");
      break;
    case CompactError::kRange:
      what = c10::str("lengths[", b, "] + src_index[", b, ", ", j, "] = ", n, " + ", s,
                      " is out of range: it must be < ", cap_name, " = ", P.capacity());
      break;
    default: {
      const int64_t i = c.position / P.table.block_size;
      what = c10::str("block_tables[", b, ", ", i, "] = ", P.table.raw(b, i), " is out of range [0, num_blocks = ",
                      P.table.num_blocks, ") but row ", b, " moves position ", c.position, " (src_index[", b, ", ", j,
                      "] = ", s, ")");
    }
  }
  TORCH_CHECK_VALUE(false, op, ": ", what, "; nothing was written");
}

// Paged: no slot may be written by one (row, position) and used by another: a forked row's
// shared blocks must hold only positions the op does not touch (< lengths[b]).
static void check_compact_slots(const KVCompactParams& P, const char* op) {
  struct Use {
    int64_t blk, off, row, pos;
    bool write;
  };
  std::vector<Use> uses;
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t n = P.lengths.get(b), count = P.count.get(b);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t s = P.src.get(b, j);
      if (s == j) continue;
      for (const auto& [pos, write] : {std::pair<int64_t, bool>{n + j, true}, {n + s, false}}) {
        Use u{0, 0, b, pos, write};
        P.locate(b, pos, u.blk, u.off);
        uses.push_back(u);
      }
    }
  }
  std::sort(uses.begin(), uses.end(), [](const Use& a, const Use& b) {
    return std::tie(a.blk, a.off, a.row, a.pos) < std::tie(b.blk, b.off, b.row, b.pos);
  });
  for (size_t k = 0; k < uses.size();) {
    size_t e = k;
    bool write = false, shared = false;
    for (; e < uses.size() && uses[e].blk == uses[k].blk && uses[e].off == uses[k].off; ++e) {
      write |= uses[e].write;
      shared |= uses[e].row != uses[k].row || uses[e].pos != uses[k].pos;
    }
    if (write && shared) {
      const Use& a = uses[k];
      const Use& o = *std::find_if(uses.begin() + k, uses.begin() + e,
                                   [&](const Use& u) { return u.row != a.row || u.pos != a.pos; });
      TORCH_CHECK_VALUE(false, op, ": block_tables map position ", a.pos, " of row ", a.row, " and position ", o.pos,
                        " of row ", o.row, " to one slot (block ", a.blk, ", offset ", a.off,
                        "), which the op writes; rows must not share the slots they compact; nothing was written");
    }
    k = e;
  }
}

// kv_compact_ and paged_kv_compact_ (P.paged): snapshots lengths, count, src_index (and
// block_tables), validates every row on the snapshot (raising before anything is written),
// then moves each (row, head) in order of j.
static void kv_compact_kernel(Cpu, KVCompactParams& P) {
  const char* op = P.paged ? "paged_kv_compact_" : "kv_compact_";
  const args::HostIndices len(P.lengths, P.B), count(P.count, P.B);
  // The columns of src_index check_row can read: a row stops at count[b] (if <= P) or at the
  // first entry past the capacity (strictly increasing from 0: at entry capacity at the latest).
  int64_t cols = 0;
  for (int64_t b = 0; b < P.B; ++b) {
    const int64_t reach = std::min(std::max<int64_t>(count[b], 0), P.P);
    cols = std::max(cols, reach > P.capacity() ? P.capacity() + 1 : reach);
  }
  const args::HostIndices src(P.src, P.B, cols);
  std::optional<args::HostIndices> table;
  if (P.paged) table.emplace(P.table.entries, P.B, P.table.max_blocks);
  for (int64_t b = 0; b < P.B; ++b) {
    const CompactCheck c = P.check_row(b);
    if (c.error != CompactError::kNone) raise_compact_error(P, op, b, c);
  }
  if (P.paged) check_compact_slots(P, op);
  if (P.row_bytes == 0) return;
  const int64_t rows_per_task = grain(mul_sat(P.row_bytes, std::max<int64_t>(cols, 1)));
  at::parallel_for(0, P.B * P.H, rows_per_task, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / P.H, h = r % P.H, n = len[b];
      for (int64_t j = 0; j < count[b]; ++j) {
        const int64_t s = P.src.get(b, j);
        if (s == j) continue;
        for (int kv = 0; kv < 2; ++kv)
          std::memcpy(P.position_row(kv, b, n + j, h), P.position_row(kv, b, n + s, h), P.row_bytes);
      }
    }
  });
}

}  // namespace specdec::cpu

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  using namespace specdec::ops;
  register_ops<specdec::cpu::Backend, KvAppendOp, KvRollbackOp, PagedKvAppendOp, PagedKvGatherOp, PagedKvGatherIntoOp,
               KvCompactOp, PagedKvCompactOp>(m);
}
