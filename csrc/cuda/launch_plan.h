// Launch planning of every CUDA op, torch-free: the real launchers (sampling_cuda.cu,
// kv_cache_cuda.cu) and the SIMT emulation (csrc/simt) both plan through these
// functions, so the emulated launches are the real ones.
//
//   sampling ops: chunk counts, stage grid sizes, the cooperative-or-stages choice,
//                 the vector-load decision and the workspace layout;
//   KV ops:       vector width, index type and grid of the copy kernels.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace specdec::cuda {

// ---- launch shapes ------------------------------------------------------------------
// verify / sample / coupled race: 256 threads, and a register budget that lets 3 blocks
// share an SM (65536 / (3 * 256) -> <= 80 registers per thread).
constexpr int kBlockThreads = 256;
constexpr int kMinBlocksPerSM = 3;
constexpr int64_t kStatBlock = 1024;  // tokens per stat block (one warp, 32 per lane)
// The stages of one staged call (stage argument of the kernels).
constexpr int kAllStages = -1;  // cooperative launch: all stages with grid syncs
constexpr int kStages = 3;
constexpr int kFilterThreads = 256;  // filter_cutoff_kernel: one block per (row, position)

// What the device offers a kernel (launch.h: device_info).
struct DeviceInfo {
  int sms = 0;            // multiprocessors
  int blocks_per_sm = 0;  // resident blocks of this kernel per SM at its block size (occupancy)
  bool cooperative = false;  // cooperative launches supported
};

// What launch_cooperative did (launch.h): launched, or refused by the device (nothing ran).
enum class CoopLaunch { kLaunched, kRefused };

// ---- the launch path of the staged sampling kernels -----------------------------
// SPECDEC_CUDA_LAUNCH (read per call, so a test can compare the paths in one process):
// "stages" = always the per-stage launches; "cooperative" = the cooperative launch
// whenever possible, also inside a CUDA-graph capture; unset / anything else =
// cooperative for eager calls, per-stage launches while the stream is being captured
// (three plain kernel nodes are always capturable; a cooperative launch refused inside
// a capture would invalidate the capture, with no way back).
// `capturing()` is asked only when the answer matters (the default, on a device with
// cooperative launches): it is a runtime call.
enum class LaunchPath { kCooperative, kStages };
template <typename Capturing>
LaunchPath choose_launch_path(const char* env, bool cooperative_device, Capturing&& capturing) {
  if (!cooperative_device || (env && std::strcmp(env, "stages") == 0)) return LaunchPath::kStages;
  if (env && std::strcmp(env, "cooperative") == 0) return LaunchPath::kCooperative;
  return capturing() ? LaunchPath::kStages : LaunchPath::kCooperative;
}

// ---- vector loads -----------------------------------------------------------------
// 16-byte vector loads are possible for rows at base + b * stride_b + i * stride_k
// (element strides; a stride of a size-1 dim is never used) when the base and every
// used stride are 16-byte aligned and V is a multiple of the vector width.
// SPECDEC_CUDA_LOADS=scalar forces the scalar path (tests compare the two).
inline bool vector_ok(const void* base, int64_t elem, int64_t V, int64_t stride_b, int64_t B, int64_t stride_k,
                      int64_t n_k) {
  const char* env = std::getenv("SPECDEC_CUDA_LOADS");
  if (!base || (env && std::strcmp(env, "scalar") == 0)) return false;
  uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base)) | static_cast<uint64_t>(V * elem);
  if (B > 1) bits |= static_cast<uint64_t>(stride_b * elem);
  if (n_k > 1) bits |= static_cast<uint64_t>(stride_k * elem);
  return (bits & 15u) == 0;
}

// ---- the workspace of the staged kernels (Ws: token_decision.cuh's Workspace) ---------------------------------------------
// Sub-buffers (bytes, each a multiple of 256); a zero-sized one is not used (its
// Workspace pointer stays null). The real launcher carves them out of one
// allocation at the running offsets; the SIMT build allocates each on its own, so
// that AddressSanitizer sees an overrun from one into the next.
// kWsResidual: verify_tree's residual rows (plan_tree), unused by the staged kernels.
enum WorkspaceBuffer : int { kWsStats = 0, kWsRace, kWsRows, kWsCutoff, kWsCoupled, kWsResidual, kWsBuffers };
struct WorkspaceLayout {
  int64_t bytes[kWsBuffers] = {};  // each rounded up to a multiple of 256 (the real launcher's offsets)
  int64_t used[kWsBuffers] = {};   // what the kernels may touch (the SIMT build allocates exactly this)
  int64_t total() const {
    int64_t t = 0;
    for (int64_t b : bytes) t += b;
    return t;
  }
  int64_t offset(int k) const {
    int64_t o = 0;
    for (int i = 0; i < k; ++i) o += bytes[i];
    return o;
  }
};

// Points the buffers of W (token_decision.cuh: Workspace) at what
// `alloc(layout, buffer)` returns (char*) for each non-empty buffer.
template <typename Ws, typename Alloc>
void bind_workspace(const WorkspaceLayout& L, Alloc&& alloc, Ws& W) {
  auto get = [&](int k) -> char* { return L.bytes[k] > 0 ? alloc(L, k) : nullptr; };
  W.stats = reinterpret_cast<decltype(W.stats)>(get(kWsStats));
  W.race = reinterpret_cast<decltype(W.race)>(get(kWsRace));
  W.rows = reinterpret_cast<decltype(W.rows)>(get(kWsRows));
  W.cutoff = reinterpret_cast<decltype(W.cutoff)>(get(kWsCutoff));
  W.coupled_y = reinterpret_cast<decltype(W.coupled_y)>(get(kWsCoupled));
}

// The plan of one staged call over `rows` stat rows (B * positions) of V tokens, of
// which `race_rows` race (verify: B; sample: B; coupled: B * (K+1)).
struct StagePlan {
  int64_t grid[kStages] = {};  // blocks each per-stage launch uses
  int64_t coop_grid = 0;       // blocks of the cooperative launch (capped at the resident limit)
  bool cooperative = false;    // try the cooperative launch first
  WorkspaceLayout workspace;
};

// Chunking of stage 2 (stages 1 and 3 split by warps, independent of C): items
// (b, c), chunk length a multiple of kStatBlock (8 race tiles: one per warp of a
// block), and enough items for every block of the grid: at B = 1, V = 128256,
// C = 126 chunks of 1024 tokens, each warp races one tile. C only decides who
// does which work, never the result.
template <typename Ws>
void choose_chunks(int64_t B, int64_t V, int64_t grid, Ws& W) {
  W.stat_blocks = (V + kStatBlock - 1) / kStatBlock;
  const int64_t want = std::max<int64_t>(1, (grid + B - 1) / B);
  const int64_t C = std::min(want, W.stat_blocks);
  W.chunk_len = (W.stat_blocks + C - 1) / C * kStatBlock;
  W.chunks = (V + W.chunk_len - 1) / W.chunk_len;
}

// Fills W's chunking and returns the plan. filters: a cutoff per stat row;
// coupled: a sample per race row.
template <typename Ws>
StagePlan plan_stages(int64_t rows, int64_t race_rows, int64_t V, const DeviceInfo& dev, LaunchPath path,
                      bool filters, bool coupled, Ws& W) {
  StagePlan p;
  const int64_t warps = kBlockThreads / 32;
  const int64_t max_grid = static_cast<int64_t>(std::max(dev.blocks_per_sm, 1)) * dev.sms;
  choose_chunks(race_rows, V, max_grid, W);
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  auto bytes = [](int64_t n, auto* typed) { return n * static_cast<int64_t>(sizeof(*typed)); };
  WorkspaceLayout& L = p.workspace;
  L.used[kWsStats] = bytes(rows * W.stat_blocks, W.stats);
  L.used[kWsRace] = bytes(race_rows * W.chunks, W.race);
  L.used[kWsRows] = bytes(std::max<int64_t>(1, race_rows), W.rows);
  L.used[kWsCutoff] = filters ? bytes(rows, W.cutoff) : 0;
  L.used[kWsCoupled] = coupled ? bytes(race_rows, W.coupled_y) : 0;
  for (int k = 0; k < kWsBuffers; ++k) L.bytes[k] = align(L.used[k]);
  p.grid[0] = (rows * W.stat_blocks + warps - 1) / warps;
  p.grid[1] = race_rows * W.chunks;
  p.grid[2] = (race_rows + warps - 1) / warps;
  p.coop_grid = std::min(max_grid, std::max({p.grid[0], p.grid[1], p.grid[2]}));
  p.cooperative = dev.blocks_per_sm > 0 && path == LaunchPath::kCooperative;
  return p;
}

// The kernels that walk a row with one block (verify_tree, verify_block): one block per row,
// grid-stride over rows, at most the resident blocks; each block owns `residual_floats`
// floats of kWsResidual; a filter cutoff per (row, position) when a filter was given.
struct RowBlockPlan {
  int64_t grid = 1;
  WorkspaceLayout workspace;
};
inline RowBlockPlan plan_row_blocks(int64_t B, int64_t positions, int64_t residual_floats, const DeviceInfo& dev,
                                    bool filters) {
  RowBlockPlan p;
  const int64_t max_grid = static_cast<int64_t>(std::max(dev.blocks_per_sm, 1)) * std::max(dev.sms, 1);
  p.grid = std::max<int64_t>(1, std::min(B, max_grid));
  WorkspaceLayout& L = p.workspace;
  L.used[kWsCutoff] = filters ? B * positions * static_cast<int64_t>(sizeof(float)) : 0;
  L.used[kWsResidual] = p.grid * residual_floats * static_cast<int64_t>(sizeof(float));
  for (int k = 0; k < kWsBuffers; ++k) L.bytes[k] = (L.used[k] + 255) / 256 * 256;
  return p;
}

// verify_tree (tree_kernels.cuh): two residual rows of V floats per block, a cutoff per (row, node).
using TreePlan = RowBlockPlan;
inline TreePlan plan_tree(int64_t B, int64_t N, int64_t V, const DeviceInfo& dev, bool filters) {
  return plan_row_blocks(B, N, 2 * V, dev, filters);
}

// verify_block (block_kernels.cuh): no buffer of size V (the race runs on the logits), a
// cutoff per (row, position), K + 1 positions.
inline RowBlockPlan plan_block_verify(int64_t B, int64_t K, const DeviceInfo& dev, bool filters) {
  return plan_row_blocks(B, K + 1, 0, dev, filters);
}

// Blocks of a one-warp-per-row launch (coupled_decide_kernel).
inline int64_t warp_per_row_grid(int64_t rows) { return (rows + kBlockThreads / 32 - 1) / (kBlockThreads / 32); }

// A grid of n blocks, clamped to [1, 2^31 - 1] (every kernel loops grid-stride).
inline dim3 to_dim(int64_t n) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(n, INT32_MAX))));
}

// ---- KV copy kernels ------------------------------------------------------------------
constexpr int kKVThreads = 256;
constexpr int64_t kKVMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

inline int64_t kv_blocks_for(int64_t total) {
  return std::max<int64_t>(1, std::min<int64_t>((total + kKVThreads - 1) / kKVThreads, kKVMaxBlocks));
}

// One launch of a copy kernel for the whole batch: `rows` rows of row_bytes in each
// of key and value, moved as vectors of the widest width (16 / 8 / 4 / 2 / 1 bytes)
// dividing `alignment` and row_bytes, plus `flag_threads` threads that only set
// sticky flags. Flat-index arithmetic is 32-bit when the index space allows it
// (64-bit division costs several times more on the GPU).
struct CopyPlan {
  int vector_bytes = 1;
  int64_t nvec = 0, copies = 0, total = 0, blocks = 0;
  bool index32 = true;
};
inline CopyPlan plan_copies(uint64_t alignment, int64_t row_bytes, int64_t rows, int64_t flag_threads) {
  CopyPlan p;
  const uint64_t bits = alignment | static_cast<uint64_t>(row_bytes) | 16;
  p.vector_bytes = static_cast<int>(bits & (~bits + 1));
  p.nvec = row_bytes / p.vector_bytes;
  p.copies = 2 * rows * p.nvec;
  p.total = std::max<int64_t>(p.copies, flag_threads);
  p.blocks = kv_blocks_for(p.total);
  p.index32 = p.total < (int64_t{1} << 31);
  return p;
}

}  // namespace specdec::cuda
