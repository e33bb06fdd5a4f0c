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
  SPECDEC_HD int64_t get(int64_t i) const { return at(i * stride); }
  // The element `offset` elements past ptr (IndexMat addresses 2-D tensors through it).
  SPECDEC_HD int64_t at(int64_t offset) const {
    return is64 ? static_cast<const int64_t*>(ptr)[offset]
                : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[offset]);
  }
  // Only used on values checked to fit the type (a decreasing length).
  SPECDEC_HD void set(int64_t i, int64_t v) const {
    if (is64) static_cast<int64_t*>(ptr)[i * stride] = v;
    else static_cast<int32_t*>(ptr)[i * stride] = static_cast<int32_t>(v);
  }
};

// An int32 or int64 [rows, N] index matrix (src_index, block_tables): `cols` holds the
// pointer, the element stride of dim 1 and the dtype; row_stride is dim 0's element stride.
struct IndexMat {
  IndexVec cols;
  int64_t row_stride = 0;
  SPECDEC_HD int64_t get(int64_t r, int64_t i) const { return cols.at(r * row_stride + i * cols.stride); }
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

// The block tables of a paged cache: entry i of row b is the block holding positions
// i * block_size .. (i+1) * block_size - 1 of that row; entries outside [0, num_blocks) are
// out of range.
struct BlockTable {
  IndexMat entries;  // [B, max_blocks]
  int64_t max_blocks = 0, block_size = 0, num_blocks = 0;

  // Positions a row's table can address.
  SPECDEC_HD int64_t capacity() const { return mul_sat(max_blocks, block_size); }
  // Entry i of row b as stored.
  SPECDEC_HD int64_t raw(int64_t b, int64_t i) const { return entries.get(b, i); }
  // Block id of entry i of row b, or -1 when the entry is out of range.
  SPECDEC_HD int64_t entry(int64_t b, int64_t i) const {
    const int64_t blk = raw(b, i);
    return (blk >= 0 && blk < num_blocks) ? blk : -1;
  }
  // Block id holding position p of row b, or -1 when its entry is out of range.
  SPECDEC_HD int64_t block_of(int64_t b, int64_t p) const { return entry(b, p / block_size); }
};

// specdec::paged_kv_gather / paged_kv_gather_into_. Output [B, H, max_len, D].
struct PagedGatherParams {
  const char* cache[2] = {nullptr, nullptr};
  int64_t cache_stride[2][3] = {};  // bytes: block, offset in block, h
  char* out[2] = {nullptr, nullptr};
  int64_t out_stride[2][3] = {};    // bytes: b, h, position
  BlockTable table;                 // [B, max_blocks]
  IndexVec lengths;                 // [B]
  int64_t B = 0, H = 0, max_len = 0, row_bytes = 0;

  // Row b's length clamped to what the output and its block table can hold.
  SPECDEC_HD int64_t clamped_length(int64_t b) const {
    int64_t n = lengths.get(b);
    const int64_t cap = table.capacity();
    if (n < 0) n = 0;
    if (n > max_len) n = max_len;
    if (n > cap) n = cap;
    return n;
  }
  SPECDEC_HD const char* cache_row(int kv, int64_t blk, int64_t off, int64_t h) const {
    return (kv ? cache[1] : cache[0]) + blk * cache_stride[kv][0] + off * cache_stride[kv][1] + h * cache_stride[kv][2];
  }
  SPECDEC_HD char* out_row(int kv, int64_t b, int64_t h, int64_t p) const {
    return (kv ? out[1] : out[0]) + b * out_stride[kv][0] + h * out_stride[kv][1] + p * out_stride[kv][2];
  }
};

// specdec::kv_compact_ / paged_kv_compact_: for each row b and j < count[b], position
// lengths[b] + j receives what position lengths[b] + src[b, j] held before the call.
// Both caches are addressed as [blocks, block_size, H, D]: a paged cache through its block
// tables; a contiguous [B, H, max_len, D] one as B blocks of max_len positions (its b,
// position and h strides), row b in block b, with no table.
//
// Walking j upwards moves every position before it is overwritten: src[b, :count[b]] is
// strictly increasing from >= 0, so src[b, j] >= j, and step j writes position n + j after
// reading n + src[b, j] >= n + j, while later steps read only positions above n + src[b, j].
enum class CompactError : int { kNone = 0, kLength, kCount, kOrder, kRange, kTable };
struct CompactCheck {
  CompactError error = CompactError::kNone;
  int64_t j = 0;         // the src index entry at fault (kOrder, kRange, kTable)
  int64_t position = 0;  // kTable: the position whose table entry is out of range
};

struct KVCompactParams {
  char* cache[2] = {nullptr, nullptr};  // key_cache, value_cache
  int64_t cache_stride[2][3] = {};      // bytes: block, offset in block, h
  IndexVec lengths, count;              // [B]
  IndexMat src;                         // [B, P]
  bool paged = false;
  BlockTable table;  // paged: the block tables; contiguous: block_size = max_len, no entries
  bool* invalid = nullptr;  // [B] sticky flags (CUDA), or nullptr
  int64_t invalid_stride = 1;
  int64_t B = 0, H = 0, P = 0, row_bytes = 0;

  // Positions a row can hold: max_len, or what its block table addresses.
  SPECDEC_HD int64_t capacity() const { return paged ? table.capacity() : table.block_size; }

  // Row b's request against the documented rules (overflow-free for any int64 values):
  // lengths[b] in [0, capacity], count[b] in [0, P], src[b, :count[b]] strictly increasing
  // from >= 0 with lengths[b] + src[b, j] < capacity, and (paged) every table entry of a
  // position the row moves from or to in range.
  SPECDEC_HD CompactCheck check_row(int64_t b) const {
    const int64_t n = lengths.get(b), c = count.get(b), cap = capacity();
    if (n < 0 || n > cap) return {CompactError::kLength, 0, 0};
    if (c < 0 || c > P) return {CompactError::kCount, 0, 0};
    int64_t prev = -1;
    for (int64_t j = 0; j < c; ++j) {
      const int64_t s = src.get(b, j);
      if (s <= prev) return {CompactError::kOrder, j, 0};
      if (s >= cap - n) return {CompactError::kRange, j, 0};
      prev = s;
      if (paged && s != j) {
        if (table.block_of(b, n + j) < 0) return {CompactError::kTable, j, n + j};
        if (table.block_of(b, n + s) < 0) return {CompactError::kTable, j, n + s};
      }
    }
    return {};
  }

  // Block and offset of position p of row b (a checked row: the block is in range).
  SPECDEC_HD void locate(int64_t b, int64_t p, int64_t& blk, int64_t& off) const {
    if (paged) {
      blk = table.block_of(b, p);
      off = p % table.block_size;
    } else {
      blk = b;
      off = p;
    }
  }
  // Row (position p of row b, head h) of cache kv, for a checked row.
  SPECDEC_HD char* position_row(int kv, int64_t b, int64_t p, int64_t h) const {
    int64_t blk, off;
    locate(b, p, blk, off);
    return (kv ? cache[1] : cache[0]) + blk * cache_stride[kv][0] + off * cache_stride[kv][1] + h * cache_stride[kv][2];
  }
};

}  // namespace specdec
