// Raw-pointer parameter blocks and index math of the KV-cache ops, shared by
// the CPU and CUDA kernels. Framework-free: the launchers fill them from
// tensors. The ops only move bytes, so every offset and stride here is in
// BYTES and the element type never matters to the kernels.
#pragma once
#include <cstdint>

#include "macros.h"

namespace specdec {

// An int32 or int64 [N] index vector (lengths, num_kept, slot_mapping, ...),
// with its element stride.
struct IndexVec {
  void* ptr = nullptr;
  int64_t stride = 1;
  bool is64 = true;
  SPECDEC_HD int64_t get(int64_t i) const {
    return is64 ? static_cast<const int64_t*>(ptr)[i * stride]
                : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i * stride]);
  }
  // Only used on values checked to fit the type (a decreasing length).
  SPECDEC_HD void set(int64_t i, int64_t v) const {
    if (is64) static_cast<int64_t*>(ptr)[i * stride] = v;
    else static_cast<int32_t*>(ptr)[i * stride] = static_cast<int32_t>(v);
  }
};

// a * b for a, b >= 0, saturated at INT64_MAX (sizes of two different tensors
// may multiply past 2^63, e.g. with an empty head dim).
SPECDEC_HD int64_t mul_sat(int64_t a, int64_t b) {
  constexpr int64_t kMax = INT64_MAX;
  return (a != 0 && b > kMax / a) ? kMax : a * b;
}

// A row of `lengths[b]` tokens can take `S` more in a cache of `max_len`.
// Overflow-free for any int64 inputs: max_len - S is only formed when both are
// in [0, max_len].
SPECDEC_HD bool kv_append_fits(int64_t length, int64_t S, int64_t max_len) {
  return length >= 0 && S >= 0 && S <= max_len && length <= max_len - S;
}

// kv_rollback_: the new length of a row, or -1 when the request is invalid
// (a negative current length, num_kept outside [0, num_appended], or a result
// that would be negative). Overflow-free for any int64 inputs: the dropped count
// num_appended - num_kept is in [0, num_appended], and the result lies in
// [0, length], so it fits the type of `lengths` (int32 included).
SPECDEC_HD int64_t kv_rollback_length(int64_t length, int64_t num_appended, int64_t num_kept) {
  if (length < 0 || num_kept < 0 || num_kept > num_appended) return -1;
  const int64_t drop = num_appended - num_kept;
  return drop > length ? -1 : length - drop;
}

// Slot of a paged cache: 0 <= slot < num_slots is written, -1 is padding
// (skipped), anything else is invalid.
enum class SlotKind : int { kWrite = 0, kSkip = 1, kInvalid = 2 };
SPECDEC_HD SlotKind classify_slot(int64_t slot, int64_t num_slots) {
  if (slot == -1) return SlotKind::kSkip;
  return (slot >= 0 && slot < num_slots) ? SlotKind::kWrite : SlotKind::kInvalid;
}

// specdec::kv_append_. Cache [B, H, max_len, D], new [B, H, S, D]; the head
// dim is contiguous in all four tensors (row_bytes = D * element size).
struct KVAppendParams {
  char* cache[2] = {nullptr, nullptr};      // key_cache, value_cache
  int64_t cache_stride[2][3] = {};          // bytes: b, h, position
  const char* src[2] = {nullptr, nullptr};  // new_k, new_v
  int64_t src_stride[2][3] = {};            // bytes: b, h, s
  IndexVec lengths;                         // [B]
  bool* overflow = nullptr;                 // [B] sticky flags (CUDA), or nullptr
  int64_t overflow_stride = 1;
  int64_t B = 0, H = 0, S = 0, max_len = 0, row_bytes = 0;

  // Row (b, h, position) of cache kv (0 = key, 1 = value); row (b, h, s) of its source.
  // (`kv ? x[1] : x[0]` rather than x[kv]: no dynamic indexing of a kernel parameter.)
  SPECDEC_HD char* cache_row(int kv, int64_t b, int64_t h, int64_t pos) const {
    return (kv ? cache[1] : cache[0]) + b * cache_stride[kv][0] + h * cache_stride[kv][1] + pos * cache_stride[kv][2];
  }
  SPECDEC_HD const char* src_row(int kv, int64_t b, int64_t h, int64_t s) const {
    return (kv ? src[1] : src[0]) + b * src_stride[kv][0] + h * src_stride[kv][1] + s * src_stride[kv][2];
  }
};

// specdec::kv_rollback_.
struct KVRollbackParams {
  IndexVec lengths;   // [B] in/out
  IndexVec num_kept;  // [B]
  bool* invalid = nullptr;  // [B] sticky flags (CUDA), or nullptr
  int64_t invalid_stride = 1;
  int64_t B = 0, num_appended = 0;
};

// specdec::paged_kv_append_. Cache [num_blocks, block_size, H, D], new [T, H, D].
struct PagedAppendParams {
  char* cache[2] = {nullptr, nullptr};
  int64_t cache_stride[2][3] = {};  // bytes: block, offset in block, h
  const char* src[2] = {nullptr, nullptr};
  int64_t src_stride[2][2] = {};    // bytes: t, h
  IndexVec slots;                   // [T]
  bool* invalid = nullptr;          // [] sticky flag (CUDA), or nullptr
  int64_t T = 0, H = 0, block_size = 0, num_blocks = 0, row_bytes = 0;

  SPECDEC_HD int64_t num_slots() const { return mul_sat(num_blocks, block_size); }
  // Row (block, offset, h) of cache kv; row (t, h) of its source.
  SPECDEC_HD char* cache_row(int kv, int64_t blk, int64_t off, int64_t h) const {
    return (kv ? cache[1] : cache[0]) + blk * cache_stride[kv][0] + off * cache_stride[kv][1] + h * cache_stride[kv][2];
  }
  SPECDEC_HD const char* src_row(int kv, int64_t t, int64_t h) const {
    return (kv ? src[1] : src[0]) + t * src_stride[kv][0] + h * src_stride[kv][1];
  }
};

// specdec::paged_kv_gather / paged_kv_gather_into_. Output [B, H, max_len, D].
struct PagedGatherParams {
  const char* cache[2] = {nullptr, nullptr};
  int64_t cache_stride[2][3] = {};  // bytes: block, offset in block, h
  char* out[2] = {nullptr, nullptr};
  int64_t out_stride[2][3] = {};    // bytes: b, h, position
  IndexVec block_tables;            // [B, max_blocks] (ptr, stride of dim 1)
  int64_t table_stride_b = 0;       // elements
  IndexVec lengths;                 // [B]
  int64_t B = 0, H = 0, max_len = 0, block_size = 0, num_blocks = 0, max_blocks = 0,
          row_bytes = 0;

  // Tokens a row's block table can address.
  SPECDEC_HD int64_t table_capacity() const { return mul_sat(max_blocks, block_size); }
  // Row b's length clamped to what the output and its block table can hold.
  SPECDEC_HD int64_t clamped_length(int64_t b) const {
    int64_t n = lengths.get(b);
    const int64_t cap = table_capacity();
    if (n < 0) n = 0;
    if (n > max_len) n = max_len;
    if (n > cap) n = cap;
    return n;
  }
  // Table entry i of row b as stored.
  SPECDEC_HD int64_t raw_table_entry(int64_t b, int64_t i) const {
    const int64_t at = b * table_stride_b + i * block_tables.stride;
    return block_tables.is64 ? static_cast<const int64_t*>(block_tables.ptr)[at]
                             : static_cast<int64_t>(static_cast<const int32_t*>(block_tables.ptr)[at]);
  }
  // Block id of table entry i of row b, or -1 when the entry is out of range.
  SPECDEC_HD int64_t table_entry(int64_t b, int64_t i) const {
    const int64_t blk = raw_table_entry(b, i);
    return (blk >= 0 && blk < num_blocks) ? blk : -1;
  }
  // Block id holding position p of row b, or -1 when the table entry is out of range.
  SPECDEC_HD int64_t block_of(int64_t b, int64_t p) const { return table_entry(b, p / block_size); }
  SPECDEC_HD const char* cache_row(int kv, int64_t blk, int64_t off, int64_t h) const {
    return (kv ? cache[1] : cache[0]) + blk * cache_stride[kv][0] + off * cache_stride[kv][1] + h * cache_stride[kv][2];
  }
  SPECDEC_HD char* out_row(int kv, int64_t b, int64_t h, int64_t p) const {
    return (kv ? out[1] : out[0]) + b * out_stride[kv][0] + h * out_stride[kv][1] + p * out_stride[kv][2];
  }
};

}  // namespace specdec
