// Unit tests of the SIMT emulator itself (csrc/simt: simt.h, simt.cpp and the shim
// headers in csrc/simt/include), with small kernels written here:
//   - thread / block indices and dimensions; every thread runs exactly once;
//   - __syncthreads: orders shared-memory writes; divergent barriers, exits at a
//     barrier and barriers after an exit are errors;
//   - warp intrinsics: the exact semantics of the four shuffles (widths, out-of-range
//     lanes), ballot / any / all; masks, divergence and exits around them are errors;
//   - SPECDEC_SHARED: per block, poisoned (0xFF bytes) at the start of every block,
//     one copy for all threads of a block;
//   - cooperative launches: grid.sync() orders writes across blocks, and is an error
//     in a non-cooperative launch;
//   - schedules: in-order, reversed and seeded random interleavings and block orders;
//   - deadlocks and missing lanes give an error rather than a hang;
//   - atomics; bit-exact fp16 / bf16 -> float for all 65536 bit patterns.
// Kernels record what they see into host vectors; the checks run after the launch.
#include <gtest/gtest.h>

#define __CUDA_ARCH__ 900
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/block_reduce.cuh"
#include "cuda/shared_memory.cuh"

namespace {

namespace cg = cooperative_groups;
using simt::Config;
using simt::SchedulePolicy;

Config schedule(SchedulePolicy policy, uint64_t seed = 0) {
  Config c;
  c.policy = policy;
  c.seed = seed;
  return c;
}
const Config kInOrder = schedule(SchedulePolicy::kInOrder);
const Config kReversed = schedule(SchedulePolicy::kReversed);

// The schedules a behaviour must hold under.
std::vector<Config> all_schedules() {
  return {kInOrder, kReversed, schedule(SchedulePolicy::kRandom, 1), schedule(SchedulePolicy::kRandom, 2),
          schedule(SchedulePolicy::kRandom, 0xC0FFEE)};
}

std::string describe(const Config& c) {
  switch (c.policy) {
    case SchedulePolicy::kInOrder: return "schedule in-order";
    case SchedulePolicy::kReversed: return "schedule reversed";
    case SchedulePolicy::kRandom: return "schedule random, seed " + std::to_string(c.seed);
  }
  return "?";
}

void launch(unsigned grid, unsigned block, const Config& c, const std::function<void()>& kernel) {
  simt::run_grid(dim3(grid), dim3(block), false, c, kernel);
}
void launch_coop(unsigned grid, unsigned block, const Config& c, const std::function<void()>& kernel) {
  simt::run_grid(dim3(grid), dim3(block), true, c, kernel);
}

// The message of the std::runtime_error a launch throws; "" when it does not throw.
std::string launch_error(unsigned grid, unsigned block, bool cooperative, const Config& c,
                         const std::function<void()>& kernel) {
  try {
    simt::run_grid(dim3(grid), dim3(block), cooperative, c, kernel);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult Contains(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\" does not contain \"" << part << "\"";
}
::testing::AssertionResult IsSimtError(const std::string& s) {
  if (s.rfind("SIMT: ", 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected a \"SIMT: \" error, got \"" << s << "\"";
}
// How the emulator names a call site of this file.
std::string at(int line) { return "test_simt.cpp:" + std::to_string(line); }

unsigned gid() { return blockIdx.x * blockDim.x + threadIdx.x; }
unsigned lane() { return threadIdx.x % 32; }

// ================================ indices =====================================

TEST(SimtIndices, EveryThreadSeesItsIndicesAndRunsExactlyOnce) {
  const unsigned grid = 3, block = 70;  // a partial last warp
  for (bool coop : {false, true}) {
    for (const Config& c : all_schedules()) {
      SCOPED_TRACE(describe(c) + (coop ? ", cooperative" : ""));
      const unsigned n = grid * block;
      std::vector<int> runs(n, 0);
      std::vector<uint3> tid(n), bid(n);
      std::vector<dim3> bdim(n), gdim(n);
      simt::run_grid(dim3(grid), dim3(block), coop, c, [&] {
        const unsigned i = gid();
        ++runs[i];
        tid[i] = threadIdx;
        bid[i] = blockIdx;
        bdim[i] = blockDim;
        gdim[i] = gridDim;
      });
      for (unsigned i = 0; i < n; ++i) {
        ASSERT_EQ(runs[i], 1) << "thread " << i;
        EXPECT_EQ(tid[i].x, i % block);
        EXPECT_EQ(bid[i].x, i / block);
        EXPECT_EQ(tid[i].y + tid[i].z + bid[i].y + bid[i].z, 0u);
        EXPECT_EQ(bdim[i].x, block);
        EXPECT_EQ(gdim[i].x, grid);
        EXPECT_EQ(bdim[i].y * bdim[i].z * gdim[i].y * gdim[i].z, 1u);
      }
    }
  }
}

TEST(SimtIndices, BadLaunchConfigurationsThrow) {
  auto nop = [] {};
  EXPECT_TRUE(Contains(launch_error(0, 32, false, kInOrder, nop), "invalid launch configuration"));
  EXPECT_TRUE(Contains(launch_error(1, 0, false, kInOrder, nop), "invalid launch configuration"));
  EXPECT_TRUE(Contains(launch_error(1, 1025, false, kInOrder, nop), "invalid launch configuration"));
  std::string two_d;
  try {
    simt::run_grid(dim3(2, 2), dim3(32), false, kInOrder, nop);
  } catch (const std::runtime_error& e) {
    two_d = e.what();
  }
  EXPECT_TRUE(Contains(two_d, "only 1-D"));
  EXPECT_EQ(launch_error(1, 1024, false, kInOrder, nop), "");
}

TEST(SimtIndices, LaunchFromInsideAKernelIsAnError) {
  std::string inner;
  launch(1, 2, kInOrder, [&] {
    if (threadIdx.x != 0) return;
    try {
      simt::run_grid(dim3(1), dim3(1), false, kInOrder, [] {});
    } catch (const std::runtime_error& e) {
      inner = e.what();
    }
  });
  EXPECT_TRUE(Contains(inner, "SIMT: a kernel launch from inside a kernel"));
}

// =============================== __syncthreads ===================================

// Tree sum over shared memory: thread 0 writes the block's sum.
void tree_sum_kernel(std::vector<long>& sums, bool with_barriers) {
  SPECDEC_SHARED(long[256], s);
  const unsigned t = threadIdx.x;
  s[t] = static_cast<long>(gid()) * gid() + 1;
  if (with_barriers) __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    if (with_barriers) __syncthreads();
  }
  if (t == 0) sums[blockIdx.x] = s[0];
}

long expected_tree_sum(unsigned block, unsigned b) {
  long sum = 0;
  for (unsigned i = b * block; i < (b + 1) * block; ++i) sum += static_cast<long>(i) * i + 1;
  return sum;
}

TEST(SimtSyncthreads, SharedMemoryTreeReductionIsExact) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<long> sums(3, 0);
    launch(3, 256, c, [&] { tree_sum_kernel(sums, true); });
    for (unsigned b = 0; b < 3; ++b) EXPECT_EQ(sums[b], expected_tree_sum(256, b));
  }
}

// The same reduction without its barriers reads unwritten (poisoned) shared memory:
// under the in-order schedule thread 0 runs to its end before thread 1 starts.
TEST(SimtSyncthreads, ReductionWithoutBarriersIsWrong) {
  std::vector<long> sums(1, 0);
  launch(1, 256, kInOrder, [&] { tree_sum_kernel(sums, false); });
  EXPECT_NE(sums[0], expected_tree_sum(256, 0));
  // s[0] + seven poisoned (-1) partners, added by thread 0 alone
  EXPECT_EQ(sums[0], 1 - 8);
}

// Two back-to-back block reductions through one scratch array, without the barrier that
// guards its reuse: a warp that finishes the first reduction early overwrites scratch
// while slower warps still read it. Random schedules release the threads of a completed
// sync point ahead of the round (as a fast warp runs ahead on a GPU), so the race shows;
// a schedule made only of rounds would act as an extra barrier and hide it.
struct IntSum {
  int v;
  IntSum shfl(int m) const { return IntSum{specdec::cuda::shfl_xor(v, m)}; }
};
struct AddInts {
  IntSum operator()(IntSum a, IntSum b) const { return IntSum{a.v + b.v}; }
};
template <bool kGuard>
int reduce_twice(IntSum* scratch) {
  auto reduce = [&](int x) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    IntSum v = specdec::cuda::warp_reduce(IntSum{x}, AddInts{});
    if (kGuard) __syncthreads();  // scratch may still be read by the previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int r = 0;
    for (int w = 0; w < warps; ++w) r += scratch[w].v;
    return r;
  };
  return reduce(1) * 1000 + reduce(2);
}

TEST(SimtSyncthreads, RandomSchedulesLetAFastWarpOvertakeSlowerOnes) {
  auto wrong_results = [](bool guard) {
    long wrong = 0;
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::vector<int> out(256);
      Config c;
      c.policy = simt::SchedulePolicy::kRandom;
      c.seed = seed;
      simt::run_grid(dim3(1), dim3(256), false, c, [&] {
        SPECDEC_SHARED(IntSum[32], scratch);
        out[threadIdx.x] = guard ? reduce_twice<true>(scratch) : reduce_twice<false>(scratch);
      });
      for (int x : out) wrong += x != 256 * 1000 + 512;
    }
    return wrong;
  };
  EXPECT_EQ(wrong_results(true), 0);
  EXPECT_GT(wrong_results(false), 0);
}

TEST(SimtSyncthreads, ThreadsAtDifferentBarriersThrowNamingBothSites) {
  for (const Config& c : {kInOrder, kReversed}) {
    SCOPED_TRACE(describe(c));
    int line_a = 0, line_b = 0;
    const std::string msg = launch_error(1, 64, false, c, [&] {
      if (threadIdx.x < 32) {
        line_a = __LINE__ + 1;
        __syncthreads();
      } else {
        line_b = __LINE__ + 1;
        __syncthreads();
      }
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "different barriers"));
    EXPECT_TRUE(Contains(msg, at(line_a)));
    EXPECT_TRUE(Contains(msg, at(line_b)));
  }
}

TEST(SimtSyncthreads, ThreadExitingWhileOthersWaitAtABarrierThrows) {
  int line = 0;
  const std::string msg = launch_error(1, 64, false, kInOrder, [&] {
    if (threadIdx.x == 63) return;  // the others are at the barrier by then (in order)
    line = __LINE__ + 1;
    __syncthreads();
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "thread 63 of block 0 exited while other threads of its block wait at __syncthreads"));
  EXPECT_TRUE(Contains(msg, at(line)));
}

TEST(SimtSyncthreads, BarrierReachedAfterAThreadExitedThrows) {
  const std::string msg = launch_error(1, 64, false, kInOrder, [&] {
    if (threadIdx.x == 0) return;  // exits before the others start (in order)
    __syncthreads();
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "thread 1 of block 0 reached __syncthreads"));
  EXPECT_TRUE(Contains(msg, "after other threads of its block exited"));
}

TEST(SimtSyncthreads, AnEarlyExitAroundABarrierThrowsUnderEverySchedule) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(2, 64, false, c, [&] {
      if (blockIdx.x == 1 && threadIdx.x == 17) return;
      __syncthreads();
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "thread 17 of block 1") || Contains(msg, "exited")) << msg;
  }
}

TEST(SimtSyncthreads, ExitsAfterTheLastBarrierAreFine) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<int> done(64, 0);
    launch(1, 64, c, [&] {
      __syncthreads();
      if (threadIdx.x % 3 == 0) return;  // no barrier follows
      done[threadIdx.x] = 1;
    });
    for (int t = 0; t < 64; ++t) EXPECT_EQ(done[t], t % 3 == 0 ? 0 : 1);
  }
}

// ================================ warp intrinsics ===================================

// The source lane of each shuffle as the CUDA C++ Programming Guide defines it, for a
// segment width w: shfl reads lane src mod w of the caller's segment; down / up read
// lane +- delta when that stays inside the segment, else keep their own value; xor reads
// lane ^ m unless that lies in a later segment (then its own value).
int idx_src(int l, int src, int w) { return l / w * w + (src & (w - 1)); }
int down_src(int l, int d, int w) { return l % w + d >= w ? l : l + d; }
int up_src(int l, int d, int w) { return l % w < d ? l : l - d; }
int xor_src(int l, int m, int w) { return (l ^ m) >= l / w * w + w ? l : (l ^ m); }

// One block of 64 threads (two warps); thread t contributes 1000 + t and stores what
// `op` returns; the result is, per thread, the thread whose value it got (value - 1000).
template <typename Op>
std::vector<int> shuffle_sources(const Config& c, Op op) {
  std::vector<int> got(64, -1);
  launch(1, 64, c, [&] { got[threadIdx.x] = op(static_cast<int>(1000 + threadIdx.x)) - 1000; });
  return got;
}

const int kWidths[] = {1, 2, 4, 8, 16, 32};

TEST(SimtWarp, ShflXorReadsTheXoredLane) {
  for (int w : kWidths) {
    for (int m : {1, 2, 3, 4, 8, 16, 31}) {
      SCOPED_TRACE("width " + std::to_string(w) + ", lane mask " + std::to_string(m));
      const auto got = shuffle_sources(kReversed, [&](int v) { return __shfl_xor_sync(0xffffffffu, v, m, w); });
      for (int t = 0; t < 64; ++t) ASSERT_EQ(got[t], t / 32 * 32 + xor_src(t % 32, m, w)) << "thread " << t;
    }
  }
  // spot checks, width 8, lane mask 8: a later segment gives the own value, an earlier one its value
  const auto got = shuffle_sources(kInOrder, [](int v) { return __shfl_xor_sync(0xffffffffu, v, 8, 8); });
  EXPECT_EQ(got[3], 3);
  EXPECT_EQ(got[11], 3);
  EXPECT_EQ(got[20], 20);
  EXPECT_EQ(got[29], 21);
  EXPECT_EQ(got[32 + 11], 32 + 3);
}

TEST(SimtWarp, ShflReadsTheSourceLaneOfItsSegment) {
  for (int w : kWidths) {
    for (int src : {0, 1, 5, 11, 31, 40, -1}) {
      SCOPED_TRACE("width " + std::to_string(w) + ", source lane " + std::to_string(src));
      const auto got = shuffle_sources(kInOrder, [&](int v) { return __shfl_sync(0xffffffffu, v, src, w); });
      for (int t = 0; t < 64; ++t) ASSERT_EQ(got[t], t / 32 * 32 + idx_src(t % 32, src, w)) << "thread " << t;
    }
  }
  // a per-lane source: lane l reads lane 31 - l (a reversal of the warp)
  const auto rev = shuffle_sources(kInOrder, [](int v) { return __shfl_sync(0xffffffffu, v, 31 - lane()); });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(rev[t], t / 32 * 32 + 31 - t % 32);
  // spot checks, width 8: source 11 is lane 3 of the segment, -1 lane 7
  const auto eleven = shuffle_sources(kInOrder, [](int v) { return __shfl_sync(0xffffffffu, v, 11, 8); });
  EXPECT_EQ(eleven[13], 11);
  EXPECT_EQ(eleven[2], 3);
  const auto minus1 = shuffle_sources(kInOrder, [](int v) { return __shfl_sync(0xffffffffu, v, -1, 8); });
  EXPECT_EQ(minus1[13], 15);
}

TEST(SimtWarp, ShflDownKeepsTheOwnValuePastTheSegmentEnd) {
  for (int w : kWidths) {
    for (unsigned d : {0u, 1u, 3u, 4u, 16u, 31u, 32u}) {
      SCOPED_TRACE("width " + std::to_string(w) + ", delta " + std::to_string(d));
      const auto got = shuffle_sources(kReversed, [&](int v) { return __shfl_down_sync(0xffffffffu, v, d, w); });
      for (int t = 0; t < 64; ++t)
        ASSERT_EQ(got[t], t / 32 * 32 + down_src(t % 32, static_cast<int>(d), w)) << "thread " << t;
    }
  }
  const auto got = shuffle_sources(kInOrder, [](int v) { return __shfl_down_sync(0xffffffffu, v, 3, 8); });
  EXPECT_EQ(got[4], 7);
  EXPECT_EQ(got[5], 5);  // 8 is in the next segment
  EXPECT_EQ(got[31], 31);
  EXPECT_EQ(got[32 + 28], 32 + 31);
}

TEST(SimtWarp, ShflUpKeepsTheOwnValueBeforeTheSegmentStart) {
  for (int w : kWidths) {
    for (unsigned d : {0u, 1u, 3u, 4u, 16u, 31u, 32u}) {
      SCOPED_TRACE("width " + std::to_string(w) + ", delta " + std::to_string(d));
      const auto got = shuffle_sources(kInOrder, [&](int v) { return __shfl_up_sync(0xffffffffu, v, d, w); });
      for (int t = 0; t < 64; ++t)
        ASSERT_EQ(got[t], t / 32 * 32 + up_src(t % 32, static_cast<int>(d), w)) << "thread " << t;
    }
  }
  const auto got = shuffle_sources(kInOrder, [](int v) { return __shfl_up_sync(0xffffffffu, v, 3, 8); });
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[10], 10);  // 7 is in the previous segment
  EXPECT_EQ(got[11], 8);
  EXPECT_EQ(got[32 + 31], 32 + 28);
}

TEST(SimtWarp, ShufflesMoveAllBitsOf64BitValues) {
  std::vector<double> d(32);
  std::vector<unsigned long long> u(32);
  launch(1, 32, kInOrder, [&] {
    const double x = 1.0 + std::ldexp(1.0, -52) * lane();  // differs in the low mantissa bits
    const unsigned long long y = 0x0123456789ABCDEFull ^ (static_cast<unsigned long long>(lane()) << 56);
    d[lane()] = __shfl_xor_sync(0xffffffffu, x, 1);
    u[lane()] = __shfl_down_sync(0xffffffffu, y, 1);
  });
  for (unsigned l = 0; l < 32; ++l) {
    EXPECT_EQ(d[l], 1.0 + std::ldexp(1.0, -52) * (l ^ 1u));
    EXPECT_EQ(u[l], 0x0123456789ABCDEFull ^ (static_cast<unsigned long long>(l == 31 ? 31 : l + 1) << 56));
  }
}

TEST(SimtWarp, ButterflySumGivesEveryLaneTheWarpTotal) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<int> sum(96, 0);
    launch(1, 96, c, [&] {
      int x = static_cast<int>(threadIdx.x);
      for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
      sum[threadIdx.x] = x;
    });
    for (int t = 0; t < 96; ++t) EXPECT_EQ(sum[t], (t / 32) * 32 * 32 + 31 * 32 / 2) << "thread " << t;
  }
}

TEST(SimtWarp, BallotAnyAllWithPartialPredicates) {
  struct Votes {
    unsigned ballot = 0;
    int any = -1, all = -1, none_any = -1, every_all = -1;
  };
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<Votes> v(64);
    launch(1, 64, c, [&] {
      const unsigned l = lane();
      Votes& o = v[threadIdx.x];
      o.ballot = __ballot_sync(0xffffffffu, l % 3 == 0);
      o.any = __any_sync(0xffffffffu, l == 17);
      o.all = __all_sync(0xffffffffu, l != 30);
      o.none_any = __any_sync(0xffffffffu, 0);
      o.every_all = __all_sync(0xffffffffu, 7);  // any non-zero value is true
    });
    for (const Votes& o : v) {
      EXPECT_EQ(o.ballot, 0x49249249u);
      EXPECT_EQ(o.any, 1);
      EXPECT_EQ(o.all, 0);
      EXPECT_EQ(o.none_any, 0);
      EXPECT_EQ(o.every_all, 1);
    }
  }
}

TEST(SimtWarp, VotesOverASubsetMaskSeeOnlyThatSubset) {
  const unsigned odd = 0xAAAAAAAAu;
  std::vector<unsigned> ballot(32, 0);
  std::vector<int> all(32, -1), any(32, -1);
  launch(1, 32, kReversed, [&] {
    const unsigned l = lane();
    if (!(odd >> l & 1u)) return;  // even lanes take no part (and exit)
    ballot[l] = __ballot_sync(odd, l < 9 || l == 31);
    all[l] = __all_sync(odd, 1);
    any[l] = __any_sync(odd, l == 0);  // lane 0 is not in the mask
  });
  for (unsigned l = 1; l < 32; l += 2) {
    EXPECT_EQ(ballot[l], (1u << 1) | (1u << 3) | (1u << 5) | (1u << 7) | (1u << 31));
    EXPECT_EQ(all[l], 1);
    EXPECT_EQ(any[l], 0);
  }
  // a half block: 16 threads, mask 0xffff
  std::vector<unsigned> half(16, 0);
  launch(1, 16, kInOrder, [&] { half[lane()] = __ballot_sync(0xffffu, lane() >= 12); });
  for (unsigned h : half) EXPECT_EQ(h, 0xf000u);
}

TEST(SimtWarp, WarpsOfABlockExchangeIndependentlyAtDifferentSites) {
  std::vector<int> got(64, -1);
  launch(1, 64, kReversed, [&] {
    const int v = static_cast<int>(threadIdx.x);
    if (threadIdx.x < 32)
      got[threadIdx.x] = __shfl_sync(0xffffffffu, v, 0);
    else
      got[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
  });
  for (int t = 0; t < 32; ++t) EXPECT_EQ(got[t], 0);
  for (int t = 32; t < 64; ++t) EXPECT_EQ(got[t], t ^ 1);
}

TEST(SimtWarp, MaskWithoutTheCallingLaneThrows) {
  const std::string msg = launch_error(1, 32, false, kInOrder, [] {
    if (lane() == 5) (void)__shfl_xor_sync(0xffffffffu & ~(1u << 5), 1, 1);
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "does not include the calling lane"));
}

TEST(SimtWarp, MaskNamingLanesBeyondTheBlockThrows) {
  const std::string msg = launch_error(1, 16, false, kInOrder, [] { (void)__ballot_sync(0xffffffffu, 1); });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "does not exist"));
}

TEST(SimtWarp, ShuffleReadingALaneOutsideTheMaskThrows) {
  const std::string msg = launch_error(1, 32, false, kInOrder, [] {
    if (lane() < 2) (void)__shfl_sync(0x3u, 1, 2);  // lane 2 is not in the mask
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "not in the mask"));
}

TEST(SimtWarp, WidthThatIsNotAPowerOfTwoThrows) {
  const std::string msg = launch_error(1, 32, false, kInOrder, [] { (void)__shfl_xor_sync(0xffffffffu, 1, 1, 12); });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "width 12"));
}

TEST(SimtWarp, LanesAtDifferentIntrinsicsThrow) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(1, 32, false, c, [] {
      if (lane() % 2)
        (void)__shfl_xor_sync(0xffffffffu, 1, 1);
      else
        (void)__ballot_sync(0xffffffffu, 1);
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "lanes of one warp meet at different warp intrinsics"));
    EXPECT_TRUE(Contains(msg, "__shfl_xor_sync"));
    EXPECT_TRUE(Contains(msg, "__ballot_sync"));
  }
}

TEST(SimtWarp, SameIntrinsicAtDifferentCallSitesThrows) {
  int line_a = 0, line_b = 0;
  const std::string msg = launch_error(1, 32, false, kInOrder, [&] {
    if (lane() < 16) {
      line_a = __LINE__ + 1;
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);
    } else {
      line_b = __LINE__ + 1;
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);
    }
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "different warp intrinsics"));
  EXPECT_TRUE(Contains(msg, at(line_a)));
  EXPECT_TRUE(Contains(msg, at(line_b)));
}

// Lanes 0 and 31 exchange with each other (mask 0x80000001) while lanes 1..30 meet with
// mask 0x7ffffffe, lane 1 at another call site than lanes 2..30: an error. In order, lane
// 0 waits (for lane 31) when lanes 1..30 arrive.
// DISABLED: simt.cpp arrive_at_exchange compares the arriving lane only with the FIRST
// waiting lane of its warp and `break`s even when that lane belongs to a disjoint
// exchange (lane 0 here), so the mismatch goes unseen and the exchange completes with
// lanes at different call sites. Enable once the check looks at the waiting lanes whose
// exchange overlaps the caller's.
TEST(SimtWarp, MismatchBesideADisjointWaitingExchangeThrows) {
  std::vector<int> got(32, -1);
  const std::string msg = launch_error(1, 32, false, kInOrder, [&] {
    const unsigned l = lane();
    const int v = static_cast<int>(l);
    if (l == 0 || l == 31) {
      got[l] = __shfl_xor_sync(0x80000001u, v, 31);
    } else if (l == 1) {
      got[l] = __shfl_sync(0x7ffffffeu, v, 1);
    } else {
      got[l] = __shfl_sync(0x7ffffffeu, v, 1);
    }
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "different warp intrinsics"));
}

TEST(SimtWarp, LaneAtABarrierWhileOthersShuffleThrows) {
  // in order: lane 0 is at the barrier first; reversed: lanes 31..1 wait at the shuffle first
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(1, 32, false, c, [] {
      if (lane() == 0)
        __syncthreads();
      else
        (void)__shfl_xor_sync(0xffffffffu, 1, 1);
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "__shfl_xor_sync"));
  }
  const std::string in_order = launch_error(1, 32, false, kInOrder, [] {
    if (lane() == 0)
      __syncthreads();
    else
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);
  });
  EXPECT_TRUE(Contains(in_order, "waits for lane 0, which is at __syncthreads"));
  const std::string reversed = launch_error(1, 32, false, kReversed, [] {
    if (lane() == 0)
      __syncthreads();
    else
      (void)__shfl_xor_sync(0xffffffffu, 1, 1);
  });
  EXPECT_TRUE(Contains(reversed, "thread 0 of block 0 reached __syncthreads"));
  EXPECT_TRUE(Contains(reversed, "of its warp waits for it at __shfl_xor_sync"));
}

TEST(SimtWarp, LaneExitingWhileOthersShuffleThrows) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(1, 32, false, c, [] {
      if (lane() == 31) return;
      (void)__shfl_down_sync(0xffffffffu, 1, 1);
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "exited"));
  }
  const std::string in_order = launch_error(1, 32, false, kInOrder, [] {
    if (lane() == 31) return;
    (void)__shfl_down_sync(0xffffffffu, 1, 1);
  });
  EXPECT_TRUE(
      Contains(in_order, "thread 31 of block 0 exited while lane 0 of its warp waits for it at __shfl_down_sync"));
}

// =============================== shared memory =====================================

TEST(SimtShared, IsOneCopyPerBlockInACooperativeLaunch) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<int> seen(4 * 64, 0);
    std::vector<const void*> where(4 * 64, nullptr);
    launch_coop(4, 64, c, [&] {
      SPECDEC_SHARED(int, s);
      if (threadIdx.x == 0) s = 100 + static_cast<int>(blockIdx.x);
      cg::this_grid().sync();  // every block has written its copy
      seen[gid()] = s;
      where[gid()] = &s;
    });
    for (unsigned i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i], 100 + static_cast<int>(i / 64)) << "thread " << i;
      EXPECT_EQ(where[i], where[i / 64 * 64]) << "thread " << i;
    }
    for (unsigned b = 1; b < 4; ++b)
      for (unsigned o = 0; o < b; ++o) EXPECT_NE(where[b * 64], where[o * 64]);
  }
}

TEST(SimtShared, IsTheSameMemoryForAllThreadsOfABlock) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const unsigned n = 96;
    std::vector<int> got(2 * n, 0);
    launch(2, n, c, [&] {
      SPECDEC_SHARED(int[96], ring);
      ring[threadIdx.x] = static_cast<int>(gid()) * 3;
      __syncthreads();
      got[gid()] = ring[(threadIdx.x + 1) % n];
    });
    for (unsigned i = 0; i < 2 * n; ++i)
      EXPECT_EQ(got[i], static_cast<int>((i / n * n + (i + 1) % n) * 3)) << "thread " << i;
  }
}

TEST(SimtShared, EachDeclarationIsItsOwnMemory) {
  std::vector<int> a_seen(32, 0), b_seen(32, 0);
  launch(1, 32, kInOrder, [&] {
    SPECDEC_SHARED(int, a);
    SPECDEC_SHARED(int, b);
    if (threadIdx.x == 0) a = 1;
    if (threadIdx.x == 1) b = 2;
    __syncthreads();
    a_seen[threadIdx.x] = a;
    b_seen[threadIdx.x] = b;
  });
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(a_seen[t], 1);
    EXPECT_EQ(b_seen[t], 2);
  }
}

// What thread 0 of each block reads before any thread of the block writes.
struct FirstRead {
  uint32_t float_bits[4];
  int ints[4];
  unsigned char bytes[8];
  long long wide;
  bool float_is_nan;
};

void poison_kernel(std::vector<FirstRead>& first) {
  SPECDEC_SHARED(float[4], f);
  SPECDEC_SHARED(int[4], i);
  SPECDEC_SHARED(unsigned char[8], c);
  SPECDEC_SHARED(long long, w);
  if (threadIdx.x == 0) {
    FirstRead& r = first[blockIdx.x];
    std::memcpy(r.float_bits, f, sizeof f);
    std::memcpy(r.ints, i, sizeof i);
    std::memcpy(r.bytes, c, sizeof c);
    r.wide = w;
    r.float_is_nan = std::isnan(f[0]);
  }
  __syncthreads();
  f[threadIdx.x % 4] = 1.0f;  // written, for the next block to (not) see
  i[threadIdx.x % 4] = 7;
  c[threadIdx.x % 8] = 0;
  w = 0;
}

void expect_poisoned(const std::vector<FirstRead>& first) {
  for (std::size_t b = 0; b < first.size(); ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    for (uint32_t x : first[b].float_bits) EXPECT_EQ(x, 0xFFFFFFFFu);
    for (int x : first[b].ints) EXPECT_EQ(x, -1);
    for (unsigned char x : first[b].bytes) EXPECT_EQ(x, 0xFF);
    EXPECT_EQ(first[b].wide, -1);
    EXPECT_TRUE(first[b].float_is_nan);
  }
}

TEST(SimtShared, IsPoisonedAtTheStartOfEveryBlock) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<FirstRead> first(5);
    std::memset(first.data(), 0, first.size() * sizeof(FirstRead));
    launch(5, 32, c, [&] { poison_kernel(first); });  // blocks one after another
    expect_poisoned(first);
    std::memset(first.data(), 0, first.size() * sizeof(FirstRead));
    launch_coop(5, 32, c, [&] { poison_kernel(first); });
    expect_poisoned(first);
  }
}

// ============================ cooperative launches ==================================

TEST(SimtGridSync, OrdersWritesAcrossBlocks) {
  const unsigned nb = 4, nt = 64;
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<int> data(nb * nt, -1), got(3 * nb * nt, -2);
    launch_coop(nb, nt, c, [&] {
      const unsigned next = ((blockIdx.x + 1) % nb) * nt + threadIdx.x;
      for (int round = 0; round < 3; ++round) {
        data[gid()] = static_cast<int>(gid()) * 10 + round;
        cg::this_grid().sync();  // the writes of this round are done
        got[round * nb * nt + gid()] = data[next];
        cg::this_grid().sync();  // the reads are done before the next round's writes
      }
    });
    for (int round = 0; round < 3; ++round)
      for (unsigned i = 0; i < nb * nt; ++i) {
        const unsigned next = ((i / nt + 1) % nb) * nt + i % nt;
        ASSERT_EQ(got[round * nb * nt + i], static_cast<int>(next) * 10 + round)
            << "round " << round << " thread " << i;
      }
  }
}

TEST(SimtGridSync, InANonCooperativeLaunchThrows) {
  const std::string msg = launch_error(2, 32, false, kInOrder, [] { cg::this_grid().sync(); });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "not launched cooperatively"));
}

TEST(SimtGridSync, DifferentCallSitesThrow) {
  int line_a = 0, line_b = 0;
  const std::string msg = launch_error(2, 32, true, kInOrder, [&] {
    if (blockIdx.x == 0) {
      line_a = __LINE__ + 1;
      cg::this_grid().sync();
    } else {
      line_b = __LINE__ + 1;
      cg::this_grid().sync();
    }
  });
  EXPECT_TRUE(IsSimtError(msg));
  EXPECT_TRUE(Contains(msg, "different grid.sync() calls"));
  EXPECT_TRUE(Contains(msg, at(line_a)));
  EXPECT_TRUE(Contains(msg, at(line_b)));
}

TEST(SimtGridSync, ExitBeforeOrDuringAGridSyncThrows) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(3, 32, true, c, [] {
      if (blockIdx.x == 1 && threadIdx.x == 4) return;
      cg::this_grid().sync();
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "exited")) << msg;
  }
}

// =============================== schedules =========================================

// The order in which the threads of one block pass two points: before the first
// barrier and between the first and the second.
struct Passes {
  std::vector<unsigned> first, second;
};
Passes block_passes(const Config& c, unsigned n) {
  Passes p;
  launch(1, n, c, [&] {
    p.first.push_back(threadIdx.x);
    __syncthreads();
    p.second.push_back(threadIdx.x);
    __syncthreads();
  });
  return p;
}

std::vector<unsigned> iota_vec(unsigned n) {
  std::vector<unsigned> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}
bool is_permutation_of_iota(std::vector<unsigned> v) {
  std::sort(v.begin(), v.end());
  return v == iota_vec(static_cast<unsigned>(v.size()));
}

TEST(SimtSchedule, InOrderRunsThreadsByIndex) {
  const Passes p = block_passes(kInOrder, 64);
  EXPECT_EQ(p.first, iota_vec(64));
  EXPECT_EQ(p.second, iota_vec(64));
}

TEST(SimtSchedule, ReversedRunsThreadsFromTheLast) {
  std::vector<unsigned> rev = iota_vec(64);
  std::reverse(rev.begin(), rev.end());
  const Passes p = block_passes(kReversed, 64);
  EXPECT_EQ(p.first, rev);
  EXPECT_EQ(p.second, rev);
}

TEST(SimtSchedule, RandomIsASeededPermutation) {
  const Passes a = block_passes(schedule(SchedulePolicy::kRandom, 7), 64);
  EXPECT_TRUE(is_permutation_of_iota(a.first));
  EXPECT_TRUE(is_permutation_of_iota(a.second));
  EXPECT_NE(a.first, iota_vec(64));
  EXPECT_NE(a.first, a.second);  // each round is shuffled anew
  const Passes again = block_passes(schedule(SchedulePolicy::kRandom, 7), 64);
  EXPECT_EQ(again.first, a.first);
  EXPECT_EQ(again.second, a.second);
  const Passes other = block_passes(schedule(SchedulePolicy::kRandom, 8), 64);
  EXPECT_TRUE(is_permutation_of_iota(other.first));
  EXPECT_NE(other.first, a.first);
}

std::vector<unsigned> block_order(const Config& c, unsigned nb) {
  std::vector<unsigned> order;
  launch(nb, 32, c, [&] {
    if (threadIdx.x == 0) order.push_back(blockIdx.x);
  });
  return order;
}

TEST(SimtSchedule, NonCooperativeBlockOrderFollowsThePolicy) {
  const unsigned nb = 16;
  EXPECT_EQ(block_order(kInOrder, nb), iota_vec(nb));
  std::vector<unsigned> rev = iota_vec(nb);
  std::reverse(rev.begin(), rev.end());
  EXPECT_EQ(block_order(kReversed, nb), rev);
  const auto r3 = block_order(schedule(SchedulePolicy::kRandom, 3), nb);
  EXPECT_TRUE(is_permutation_of_iota(r3));
  EXPECT_NE(r3, iota_vec(nb));
  EXPECT_NE(r3, rev);
  EXPECT_EQ(block_order(schedule(SchedulePolicy::kRandom, 3), nb), r3);
  EXPECT_NE(block_order(schedule(SchedulePolicy::kRandom, 4), nb), r3);
}

TEST(SimtSchedule, NonCooperativeBlocksRunOneAfterAnother) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    std::vector<unsigned> events;  // block index at each step of each thread
    launch(4, 32, c, [&] {
      events.push_back(blockIdx.x);
      __syncthreads();
      events.push_back(blockIdx.x);
    });
    ASSERT_EQ(events.size(), 4u * 64u);
    for (std::size_t k = 0; k < events.size(); k += 64)
      for (std::size_t j = k; j < k + 64; ++j) EXPECT_EQ(events[j], events[k]) << "step " << j;
  }
}

// The (block, thread) order of the first pass in a cooperative launch.
std::vector<unsigned> coop_passes(const Config& c, unsigned nb, unsigned nt) {
  std::vector<unsigned> order;
  launch_coop(nb, nt, c, [&] {
    order.push_back(gid());
    cg::this_grid().sync();
  });
  return order;
}

TEST(SimtSchedule, CooperativeLaunchesFollowThePolicy) {
  EXPECT_EQ(coop_passes(kInOrder, 3, 8), iota_vec(24));
  const auto r = coop_passes(schedule(SchedulePolicy::kRandom, 5), 3, 8);
  EXPECT_TRUE(is_permutation_of_iota(r));
  EXPECT_NE(r, iota_vec(24));
  EXPECT_EQ(coop_passes(schedule(SchedulePolicy::kRandom, 5), 3, 8), r);
  // reversed: within each block the threads run from the last
  const auto rev = coop_passes(kReversed, 3, 8);
  ASSERT_TRUE(is_permutation_of_iota(rev));
  for (std::size_t k = 0; k + 1 < rev.size(); ++k)
    if (rev[k] / 8 == rev[k + 1] / 8) {
      EXPECT_GT(rev[k], rev[k + 1]);
    }
}

// DISABLED: in a cooperative launch the reversed policy runs the BLOCKS in ascending
// order (block 0's threads first, reversed), not from the last block: run_grid reverses
// block_order, and execute() then reverses the whole first round again (order() in
// next_ready), which puts block 0 back in front; after a grid.sync() make_ready walks
// run.blocks (descending) and order() reverses that again. So across blocks "reversed"
// gives the same block order as "in-order". Enable once simt.cpp reverses only once.
TEST(SimtSchedule, ReversedCooperativeLaunchIsTheReverseOfInOrder) {
  std::vector<unsigned> rev = iota_vec(24);
  std::reverse(rev.begin(), rev.end());
  EXPECT_EQ(coop_passes(kReversed, 3, 8), rev);
}

// ============================ deadlocks, missing lanes ================================

TEST(SimtDeadlock, BarrierAgainstGridSyncIsReportedNotHung) {
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(1, 64, true, c, [] {
      if (threadIdx.x == 40)
        __syncthreads();  // waits for the others, who wait at grid.sync() for it
      else
        cg::this_grid().sync();
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "deadlock: no thread can proceed"));
  }
}

TEST(SimtDeadlock, MissingLaneAtGridSyncIsReportedNotHung) {
  // lane 1 never joins lane 0's shuffle: it waits at grid.sync() with the other threads
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    const std::string msg = launch_error(2, 32, true, c, [] {
      if (blockIdx.x == 0 && threadIdx.x == 0) (void)__shfl_xor_sync(0x3u, 1, 1);
      cg::this_grid().sync();
    });
    EXPECT_TRUE(IsSimtError(msg));
    EXPECT_TRUE(Contains(msg, "deadlock") || Contains(msg, "which is at grid.sync()") ||
                Contains(msg, "waits for it at __shfl_xor_sync")) << msg;
  }
}

TEST(SimtDeadlock, LaunchesWorkNormallyAfterAnError) {
  EXPECT_TRUE(IsSimtError(launch_error(2, 64, true, kInOrder, [] {
    if (threadIdx.x == 3) return;
    __syncthreads();
  })));
  std::vector<long> sums(2, 0);
  launch(2, 256, kReversed, [&] { tree_sum_kernel(sums, true); });
  EXPECT_EQ(sums[0], expected_tree_sum(256, 0));
  EXPECT_EQ(sums[1], expected_tree_sum(256, 1));
}

// ================================== atomics ==========================================

TEST(SimtAtomics, TotalsAreExact) {
  const unsigned nb = 4, nt = 96, n = nb * nt;
  for (const Config& c : all_schedules()) {
    SCOPED_TRACE(describe(c));
    unsigned u = 0, bits = 0, ticket = 0;
    unsigned long long ull = 0;
    int si = 0, ibits = 0, mn = INT_MAX;
    std::vector<unsigned> tickets(n, ~0u);
    launch_coop(nb, nt, c, [&] {
      const unsigned i = gid();
      atomicAdd(&u, i + 1);
      __syncthreads();
      atomicAdd(&ull, (1ull << 40) + i);
      atomicAdd(&si, i % 2 ? -3 : 1);
      cg::this_grid().sync();
      if (i % 5 == 0) atomicOr(&bits, 1u << (i % 32));
      atomicOr(&ibits, static_cast<int>(1u << (i % 7)));
      atomicMin(&mn, static_cast<int>((i * 7919u) % 100003u) - 50000);
      tickets[i] = atomicAdd(&ticket, 1u);
    });
    unsigned want_bits = 0;
    int want_min = INT_MAX;
    for (unsigned i = 0; i < n; ++i) {
      if (i % 5 == 0) want_bits |= 1u << (i % 32);
      want_min = std::min(want_min, static_cast<int>((i * 7919u) % 100003u) - 50000);
    }
    EXPECT_EQ(u, n * (n + 1) / 2);
    EXPECT_EQ(ull, (static_cast<unsigned long long>(n) << 40) + static_cast<unsigned long long>(n) * (n - 1) / 2);
    EXPECT_EQ(si, static_cast<int>(n / 2) * 1 - static_cast<int>(n / 2) * 3);
    EXPECT_EQ(bits, want_bits);
    EXPECT_EQ(ibits, 0x7f);
    EXPECT_EQ(mn, want_min);
    EXPECT_EQ(ticket, n);
    EXPECT_TRUE(is_permutation_of_iota(tickets));  // atomicAdd returns each old value once
  }
}

TEST(SimtAtomics, ReturnTheOldValue) {
  unsigned u = 5;
  EXPECT_EQ(atomicAdd(&u, 3u), 5u);
  EXPECT_EQ(u, 8u);
  int i = -4;
  EXPECT_EQ(atomicAdd(&i, 10), -4);
  EXPECT_EQ(atomicOr(&i, 1), 6);
  EXPECT_EQ(i, 7);
  EXPECT_EQ(atomicMin(&i, 9), 7);
  EXPECT_EQ(i, 7);
  EXPECT_EQ(atomicMin(&i, -9), 7);
  EXPECT_EQ(i, -9);
  unsigned long long w = ~0ull;
  EXPECT_EQ(atomicAdd(&w, 2ull), ~0ull);
  EXPECT_EQ(w, 1ull);  // wraps
}

// ============================ fp16 / bf16 conversions ================================

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// binary16 decoded from its fields: (-1)^s * m * 2^-24 (subnormal) or (1024 + m) * 2^(e - 25).
float half_reference(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float mag;
  if (e == 0x1f)
    mag = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (e == 0)
    mag = std::ldexp(static_cast<float>(m), -24);
  else
    mag = std::ldexp(static_cast<float>(1024 + m), e - 25);
  return s ? -mag : mag;
}

// bfloat16 decoded from its fields: m * 2^-133 (subnormal) or (128 + m) * 2^(e - 134).
float bf16_reference(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  float mag;
  if (e == 0xff)
    mag = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (e == 0)
    mag = std::ldexp(static_cast<float>(m), -133);
  else
    mag = std::ldexp(static_cast<float>(128 + m), e - 134);
  return s ? -mag : mag;
}

TEST(SimtFloat16, HalfToFloatIsExactForAllBitPatterns) {
  int subnormals = 0, nans = 0;
  for (uint32_t u = 0; u < 65536; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    EXPECT_EQ(__half_as_ushort(__ushort_as_half(h)), h);
    const float got = __half2float(__ushort_as_half(h));
    const float want = half_reference(h);
    if (std::isnan(want)) {
      ++nans;
      ASSERT_TRUE(std::isnan(got)) << std::hex << "0x" << u;
      // sign and payload kept (the header promises the payload)
      ASSERT_EQ(bits_of(got), ((u & 0x8000u) << 16) | 0x7f800000u | ((u & 0x3ffu) << 13)) << std::hex << "0x" << u;
    } else {
      if ((u & 0x7c00u) == 0 && (u & 0x3ffu) != 0) ++subnormals;
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << "0x" << u << ": " << got << " vs " << want;
    }
  }
  EXPECT_EQ(subnormals, 2 * 1023);
  EXPECT_EQ(nans, 2 * 1023);
  // hand-checked values
  EXPECT_EQ(__half2float(__ushort_as_half(0x0001)), 5.9604644775390625e-08f);  // 2^-24
  EXPECT_EQ(__half2float(__ushort_as_half(0x03ff)), 6.0975551605224609375e-05f);
  EXPECT_EQ(__half2float(__ushort_as_half(0x0400)), 6.103515625e-05f);  // 2^-14
  EXPECT_EQ(__half2float(__ushort_as_half(0x3c00)), 1.0f);
  EXPECT_EQ(__half2float(__ushort_as_half(0xc000)), -2.0f);
  EXPECT_EQ(__half2float(__ushort_as_half(0x7bff)), 65504.0f);
  EXPECT_EQ(bits_of(__half2float(__ushort_as_half(0x8000))), 0x80000000u);
}

TEST(SimtFloat16, Bfloat16ToFloatIsExactForAllBitPatterns) {
  int subnormals = 0, nans = 0;
  for (uint32_t u = 0; u < 65536; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    const float got = __bfloat162float(__nv_bfloat16{h});
    const float want = bf16_reference(h);
    if (std::isnan(want)) {
      ++nans;
      ASSERT_TRUE(std::isnan(got)) << std::hex << "0x" << u;
      ASSERT_EQ(bits_of(got), u << 16) << std::hex << "0x" << u;
    } else {
      if ((u & 0x7f80u) == 0 && (u & 0x7fu) != 0) ++subnormals;
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << "0x" << u << ": " << got << " vs " << want;
    }
  }
  EXPECT_EQ(subnormals, 2 * 127);
  EXPECT_EQ(nans, 2 * 127);
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0x3f80}), 1.0f);
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0xc040}), -3.0f);
  EXPECT_EQ(bits_of(__bfloat162float(__nv_bfloat16{0x0001})), 0x00010000u);  // 2^-133, a float subnormal
}

// ============================== configuration ========================================

TEST(SimtConfig, FromEnvironment) {
  ::setenv("SPECDEC_SIMT_SMS", "5", 1);
  ::setenv("SPECDEC_SIMT_BLOCKS_PER_SM", "3", 1);
  ::setenv("SPECDEC_SIMT_COOPERATIVE", "0", 1);
  ::setenv("SPECDEC_SIMT_SCHEDULE", "reversed", 1);
  Config c = simt::config_from_env();
  EXPECT_EQ(c.sms, 5);
  EXPECT_EQ(c.blocks_per_sm, 3);
  EXPECT_FALSE(c.cooperative);
  EXPECT_EQ(c.policy, SchedulePolicy::kReversed);
  ::setenv("SPECDEC_SIMT_SCHEDULE", "12345", 1);
  c = simt::config_from_env();
  EXPECT_EQ(c.policy, SchedulePolicy::kRandom);
  EXPECT_EQ(c.seed, 12345u);
  ::setenv("SPECDEC_SIMT_SCHEDULE", "sideways", 1);
  EXPECT_THROW(simt::config_from_env(), std::runtime_error);
  for (const char* v : {"SPECDEC_SIMT_SMS", "SPECDEC_SIMT_BLOCKS_PER_SM", "SPECDEC_SIMT_COOPERATIVE",
                        "SPECDEC_SIMT_SCHEDULE"})
    ::unsetenv(v);
  c = simt::config_from_env();
  EXPECT_EQ(c.policy, SchedulePolicy::kInOrder);
  EXPECT_TRUE(c.cooperative);
}

}  // namespace
