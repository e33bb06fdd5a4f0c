// Index math of the KV-cache ops (core/kv_cache.h): overflow-free for any int64.
#include <gtest/gtest.h>

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

}  // namespace
