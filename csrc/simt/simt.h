// SIMT emulation of the CUDA execution model on the CPU, so that the project's
// CUDA kernel source (csrc/cuda/*.cuh) runs unchanged as host C++ on any machine.
// See csrc/simt/NOTES.md for what it models, what it checks and what it cannot show.
//
// One fiber per CUDA thread (Boost.Context), all on the calling OS thread; a fiber
// runs until it reaches a sync point (__syncthreads, a warp intrinsic, grid.sync(),
// the end of the kernel), and the scheduler picks the order in which ready fibers
// run between sync points (in order, reversed, or seeded random: SchedulePolicy).
// Included through the shim headers in csrc/simt/include (cuda_runtime.h, ...),
// never by code that includes torch: the kernels' translation unit defines
// __CUDA_ARCH__ so the device branches of csrc/core compile.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

// ---- CUDA keywords ------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Shared memory is declared with SPECDEC_SHARED (csrc/cuda/shared_memory.cuh): a
// plain __shared__ cannot be made per-block in host C++.
#define __shared__ _Pragma("GCC error \"declare shared memory with SPECDEC_SHARED (csrc/cuda/shared_memory.cuh)\"")

// ---- vector types -----------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// ---- streams, errors ----------------------------------------------------------
struct SimtStream;
using cudaStream_t = SimtStream*;
enum cudaError_t { cudaSuccess = 0, cudaErrorCooperativeLaunchTooLarge = 720, cudaErrorNotSupported = 801 };

namespace simt {

// ---- the running thread ---------------------------------------------------------
struct ThreadIndex {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
// The index of the fiber that is running (aborts outside a kernel).
const ThreadIndex& current_index();

// ---- sync points ----------------------------------------------------------------
void syncthreads(const char* file, int line);
void grid_sync(const char* file, int line);

enum class WarpOp : int { kShflXor = 0, kShfl = 1, kShflDown = 2, kShflUp = 3, kBallot = 4, kAny = 5, kAll = 6 };
// One warp-wide exchange: every lane in `mask` must call it (same op, same mask, same
// call site); returns this lane's result (shuffles: the source lane's bits).
uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, const char* file, int line);

// ---- launching --------------------------------------------------------------------
enum class SchedulePolicy : int { kInOrder = 0, kReversed = 1, kRandom = 2 };

struct Config {
  int sms = 2;             // emulated SMs
  int blocks_per_sm = 2;   // resident blocks per SM (cooperative grid limit = sms * blocks_per_sm)
  bool cooperative = true; // the emulated device supports cooperative launches
  bool refuse_cooperative = false;  // ... but refuses them (as under MPS or a green context)
  SchedulePolicy policy = SchedulePolicy::kInOrder;
  uint64_t seed = 0;       // kRandom: the seed of the schedule (the same seed, the same run)
};
// The configuration of the next launch: SPECDEC_SIMT_SMS, SPECDEC_SIMT_BLOCKS_PER_SM,
// SPECDEC_SIMT_COOPERATIVE ("1", "0" = not supported, "refuse" = supported but every
// cooperative launch refused) and SPECDEC_SIMT_SCHEDULE ("inorder", "reversed" or a
// random seed as an integer), read at each call.
Config config_from_env();

// A boolean setting: unset or empty = dflt, "0" / "1", anything else throws naming `name`.
bool env_flag(const char* name, bool dflt);

// Launches since the library was loaded (the launch layer counts them; tests read them
// through torch.ops.specdec_simt.launch_counts to see which path a call took).
struct LaunchCounts {
  long ordinary = 0;     // launch()
  long cooperative = 0;  // launch_cooperative() that ran
  long refused = 0;      // launch_cooperative() that the emulated device refused
};
LaunchCounts& launch_counts();

// Runs `kernel` (a call of the kernel function with its arguments) over grid x block
// threads. cooperative: every block is resident at once (grid.sync() allowed); else
// the blocks run one after another in the schedule's order. Throws
// std::runtime_error("SIMT: ...") on a barrier / warp-intrinsic misuse or a deadlock.
void run_grid(dim3 grid, dim3 block, bool cooperative, const Config& cfg, const std::function<void()>& kernel);

// Shared memory of the current block: `key` identifies one declaration (one per
// template instantiation); the first thread of a block to reach it allocates `bytes`
// filled with a poison pattern (0xFF bytes: NaN floats, -1 integers), later threads
// of that block get the same memory. Each declaration is its own allocation.
void* block_shared(const void* key, std::size_t bytes, std::size_t align);

}  // namespace simt

// ---- built-in variables ---------------------------------------------------------
#define threadIdx (::simt::current_index().thread_idx)
#define blockIdx (::simt::current_index().block_idx)
#define blockDim (::simt::current_index().block_dim)
#define gridDim (::simt::current_index().grid_dim)

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::simt::syncthreads(file, line);
}

// ---- warp intrinsics -----------------------------------------------------------------
namespace simt {
template <typename T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "4- or 8-byte shuffle values");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
}  // namespace simt

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return simt::from_bits<T>(
      simt::warp_exchange(simt::WarpOp::kShflXor, mask, simt::to_bits(v), lane_mask, width, file, line));
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return simt::from_bits<T>(
      simt::warp_exchange(simt::WarpOp::kShfl, mask, simt::to_bits(v), src_lane, width, file, line));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return simt::from_bits<T>(simt::warp_exchange(simt::WarpOp::kShflDown, mask, simt::to_bits(v),
                                                static_cast<int>(delta), width, file, line));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return simt::from_bits<T>(simt::warp_exchange(simt::WarpOp::kShflUp, mask, simt::to_bits(v),
                                                static_cast<int>(delta), width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(simt::warp_exchange(simt::WarpOp::kBallot, mask, pred != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(simt::warp_exchange(simt::WarpOp::kAny, mask, pred != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(simt::warp_exchange(simt::WarpOp::kAll, mask, pred != 0, 0, 32, file, line));
}

// ---- integer and bit intrinsics ------------------------------------------------------
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * static_cast<uint64_t>(b)) >> 32);
}
inline unsigned __float_as_uint(float x) { return simt::from_bits<unsigned>(simt::to_bits(x)); }
inline float __uint_as_float(unsigned u) { return simt::from_bits<float>(u); }

// ---- atomics ----------------------------------------------------------------------
// All fibers run on one OS thread and switch only at sync points, so a
// read-modify-write is atomic as it stands.
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned o = *p; *p = o + v; return o; }
inline int atomicAdd(int* p, int v) { const int o = *p; *p = static_cast<int>(static_cast<unsigned>(o) + static_cast<unsigned>(v)); return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { const unsigned long long o = *p; *p = o + v; return o; }
inline float atomicAdd(float* p, float v) { const float o = *p; *p = o + v; return o; }
inline int atomicOr(int* p, int v) { const int o = *p; *p = o | v; return o; }
inline unsigned atomicOr(unsigned* p, unsigned v) { const unsigned o = *p; *p = o | v; return o; }
inline int atomicMin(int* p, int v) { const int o = *p; *p = v < o ? v : o; return o; }
inline int atomicMax(int* p, int v) { const int o = *p; *p = v > o ? v : o; return o; }
inline unsigned atomicMin(unsigned* p, unsigned v) { const unsigned o = *p; *p = v < o ? v : o; return o; }
inline unsigned atomicMax(unsigned* p, unsigned v) { const unsigned o = *p; *p = v > o ? v : o; return o; }
