// Index math of the KV-cache ops (core/kv_cache.h): overflow-free for any int64.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>

#include "core/kv_cache.h"

namespace {
using namespace specdec;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(KVMath, RollbackLength) {
  EXPECT_EQ(kv_rollback_length(10, 6, 2), 6);
  EXPECT_EQ(kv_rollback_length(10, 6, 6), 10);
  EXPECT_EQ(kv_rollback_length(3, 6, 2), -1);   // would go negative
  EXPECT_EQ(kv_rollback_length(10, 6, 7), -1);  // rolling forward
  EXPECT_EQ(kv_rollback_length(10, 6, -1), -1);
  // issue 11: -2 - (2^63 - 1) wrapped to INT64_MAX
  EXPECT_EQ(kv_rollback_length(-2, kMax, 0), -1);
  EXPECT_EQ(kv_rollback_length(kMin, kMax, kMax), -1);
  EXPECT_EQ(kv_rollback_length(5, kMax, kMax - 3), 2);
  EXPECT_EQ(kv_rollback_length(kMax, kMax, 0), 0);
  EXPECT_EQ(kv_rollback_length(kMax, kMax, kMax), kMax);
}

TEST(KVMath, AppendFits) {
  EXPECT_TRUE(kv_append_fits(5, 3, 8));
  EXPECT_FALSE(kv_append_fits(6, 3, 8));
  EXPECT_FALSE(kv_append_fits(-1, 0, 8));
  EXPECT_FALSE(kv_append_fits(kMax, 1, 8));
  EXPECT_FALSE(kv_append_fits(kMax, kMax, kMax));
  EXPECT_TRUE(kv_append_fits(0, kMax, kMax));
  EXPECT_FALSE(kv_append_fits(0, 9, 8));
  EXPECT_FALSE(kv_append_fits(0, -1, 8));
  EXPECT_FALSE(kv_append_fits(kMin, 1, 8));
}

TEST(KVMath, SaturatingProducts) {
  EXPECT_EQ(mul_sat(0, kMax), 0);
  EXPECT_EQ(mul_sat(3, 4), 12);
  EXPECT_EQ(mul_sat(int64_t{1} << 40, int64_t{1} << 40), kMax);
  PagedAppendParams P;
  P.num_blocks = int64_t{1} << 40;
  P.block_size = int64_t{1} << 40;
  EXPECT_EQ(P.num_slots(), kMax);
  EXPECT_EQ(classify_slot(kMax - 1, P.num_slots()), SlotKind::kWrite);
  EXPECT_EQ(classify_slot(-1, P.num_slots()), SlotKind::kSkip);
  EXPECT_EQ(classify_slot(-2, P.num_slots()), SlotKind::kInvalid);
}

// kv_compact_ / paged_kv_compact_: row b of the int64 arrays below (lengths, count, src [B, 4],
// tables [B, 3]) checked by KVCompactParams::check_row.
struct CompactRows {
  int64_t lengths[8], count[8], src[8][4], tables[8][3];
  KVCompactParams params(bool paged, int64_t capacity_or_block, int64_t num_blocks) {
    KVCompactParams P;
    P.lengths.ptr = lengths;
    P.count.ptr = count;
    P.src.cols.ptr = src;
    P.src.row_stride = 4;
    P.P = 4;
    P.paged = paged;
    P.table.block_size = capacity_or_block;
    if (paged) {
      P.table.entries.cols.ptr = tables;
      P.table.entries.row_stride = 3;
      P.table.max_blocks = 3;
      P.table.num_blocks = num_blocks;
    }
    return P;
  }
};

CompactCheck check(const KVCompactParams& P, CompactRows& rows, int64_t n, int64_t c, std::array<int64_t, 4> src,
                   std::array<int64_t, 3> table = {0, 1, 2}) {
  rows.lengths[0] = n;
  rows.count[0] = c;
  for (int i = 0; i < 4; ++i) rows.src[0][i] = src[i];
  for (int i = 0; i < 3; ++i) rows.tables[0][i] = table[i];
  return P.check_row(0);
}

TEST(KVMath, CompactRowsContiguous) {
  CompactRows rows{};
  const KVCompactParams P = rows.params(false, 10, 0);
  EXPECT_EQ(P.capacity(), 10);
  auto error = [&](int64_t n, int64_t c, std::array<int64_t, 4> src) { return check(P, rows, n, c, src).error; };
  EXPECT_EQ(error(1, 3, {0, 2, 3, kMin}), CompactError::kNone);  // entries past count are not read
  EXPECT_EQ(error(6, 4, {0, 1, 2, 3}), CompactError::kNone);     // 6 + 3 = 9 < 10
  EXPECT_EQ(error(10, 0, {kMin, kMin, kMin, kMin}), CompactError::kNone);
  EXPECT_EQ(error(6, 4, {0, 1, 2, 4}), CompactError::kRange);
  EXPECT_EQ(error(10, 1, {0, 0, 0, 0}), CompactError::kRange);
  EXPECT_EQ(error(5, 2, {0, kMax, 0, 0}), CompactError::kRange);  // no overflow in n + src
  EXPECT_EQ(error(kMax, 0, {0, 0, 0, 0}), CompactError::kLength);
  EXPECT_EQ(error(-1, 0, {0, 0, 0, 0}), CompactError::kLength);
  EXPECT_EQ(error(kMin, 1, {0, 0, 0, 0}), CompactError::kLength);
  EXPECT_EQ(error(0, 5, {0, 1, 2, 3}), CompactError::kCount);
  EXPECT_EQ(error(0, -1, {0, 1, 2, 3}), CompactError::kCount);
  EXPECT_EQ(error(0, kMin, {0, 1, 2, 3}), CompactError::kCount);
  const CompactCheck equal = check(P, rows, 0, 3, {0, 2, 2, 3});
  EXPECT_EQ(equal.error, CompactError::kOrder);
  EXPECT_EQ(equal.j, 2);
  EXPECT_EQ(check(P, rows, 0, 2, {-1, 0, 0, 0}).error, CompactError::kOrder);
  EXPECT_EQ(check(P, rows, 0, 2, {kMin, 0, 0, 0}).error, CompactError::kOrder);
  EXPECT_EQ(check(P, rows, 0, 3, {1, 0, 2, 0}).error, CompactError::kOrder);
  // position p of row b: block b, offset p
  int64_t blk = -1, off = -1;
  P.locate(3, 7, blk, off);
  EXPECT_EQ(blk, 3);
  EXPECT_EQ(off, 7);
}

TEST(KVMath, CompactRowsPaged) {
  CompactRows rows{};
  const KVCompactParams P = rows.params(true, 4, 5);  // blocks of 4, 3 per row: capacity 12
  EXPECT_EQ(P.capacity(), 12);
  const CompactCheck ok = check(P, rows, 2, 3, {0, 3, 9, 0}, {4, 0, 1});
  EXPECT_EQ(ok.error, CompactError::kNone);
  // position 3 <- 5: the destination's entry 0, the source's entry 1
  const CompactCheck dst = check(P, rows, 2, 3, {0, 3, 9, 0}, {-1, 0, 1});
  EXPECT_EQ(dst.error, CompactError::kTable);
  EXPECT_EQ(dst.j, 1);
  EXPECT_EQ(dst.position, 3);
  const CompactCheck src = check(P, rows, 2, 3, {0, 3, 9, 0}, {4, -1, 1});
  EXPECT_EQ(src.error, CompactError::kTable);
  EXPECT_EQ(src.j, 1);
  EXPECT_EQ(src.position, 5);
  const CompactCheck last = check(P, rows, 2, 3, {0, 3, 9, 0}, {4, 0, 5});  // 4 <- 11: entry 2 = num_blocks
  EXPECT_EQ(last.error, CompactError::kTable);
  EXPECT_EQ(last.position, 11);
  // positions moved onto themselves read no table entry
  EXPECT_EQ(check(P, rows, 0, 2, {0, 1, 0, 0}, {kMin, kMax, -1}).error, CompactError::kNone);
  EXPECT_EQ(check(P, rows, 2, 1, {10, 0, 0, 0}, {0, 1, 2}).error, CompactError::kRange);
  EXPECT_EQ(check(P, rows, 13, 0, {0, 0, 0, 0}, {0, 1, 2}).error, CompactError::kLength);
  int64_t blk = -1, off = -1;
  rows.tables[0][2] = 3;
  P.locate(0, 9, blk, off);
  EXPECT_EQ(blk, 3);
  EXPECT_EQ(off, 1);
  // saturated capacity: no overflow for huge tables
  KVCompactParams huge = P;
  huge.table.max_blocks = int64_t{1} << 40;
  huge.table.block_size = int64_t{1} << 40;
  EXPECT_EQ(huge.capacity(), kMax);
}

TEST(KVMath, IndexMatrix) {
  const int32_t data[2][3] = {{1, 2, 3}, {4, 5, 6}};
  IndexMat m;
  m.cols.ptr = const_cast<int32_t*>(&data[0][0]);
  m.cols.is64 = false;
  m.cols.stride = 3;  // the transposed view [3, 2]
  m.row_stride = 1;
  EXPECT_EQ(m.get(0, 1), 4);
  EXPECT_EQ(m.get(2, 0), 3);
  EXPECT_EQ(m.get(2, 1), 6);
}

}  // namespace
