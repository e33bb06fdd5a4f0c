// The SIMT emulator (simt.h): fibers, the scheduler, barriers, warp exchanges,
// grid sync and per-block shared memory.
#include "simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, std::size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                std::size_t* size_old);
#endif

// The scheduler's hot paths are not instrumented by the sanitizer and coverage builds:
// the memcheck analog is about the kernels' memory and the coverage figure about the
// kernels' lines, and instrumenting every fiber switch and warp exchange would multiply
// those runs' time for nothing.
#define SIMT_HOT __attribute__((no_sanitize("address", "undefined"), no_profile_instrument_function))

namespace simt {
namespace {

namespace ctx = boost::context;

// ---- fiber stacks ---------------------------------------------------------------------
// Carved from 4 MiB arenas (transparent huge pages where the kernel allows: a switch
// to a fiber touches its stack, and 256+ fibers on 4 KiB pages thrash the TLB), reused
// across launches. Each stack has a guard page below it, so an overflow faults
// instead of corrupting its neighbour (that page splits the huge page: sanitizer
// builds only, where speed matters less).
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kStackBytes = 256 * 1024;  // ASan's redzones make frames larger
constexpr bool kGuardPages = true;
#else
constexpr std::size_t kStackBytes = 64 * 1024;
constexpr bool kGuardPages = false;
#endif
constexpr std::size_t kArenaBytes = 4u << 20;

class StackPool {
 public:
  ~StackPool() {
    for (void* a : arenas_) munmap(a, kArenaBytes);
  }
  ctx::stack_context take() {
    if (free_.empty()) grow();
    char* top = free_.back();
    free_.pop_back();
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = top;
    return sc;
  }
  void give(ctx::stack_context& sc) {
#if defined(__SANITIZE_ADDRESS__)
    // a fiber unwound after an error leaves ASan's marks of its frames behind
    __asan_unpoison_memory_region(static_cast<char*>(sc.sp) - sc.size, sc.size);
#endif
    free_.push_back(static_cast<char*>(sc.sp));
  }

 private:
  void grow() {
    void* a = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) throw std::runtime_error("SIMT: cannot map fiber stacks");
    madvise(a, kArenaBytes, MADV_HUGEPAGE);
    arenas_.push_back(a);
    char* base = static_cast<char*>(a);
    for (std::size_t off = kArenaBytes; off >= kStackBytes; off -= kStackBytes) {
      if (kGuardPages) mprotect(base + off - kStackBytes, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);
      free_.push_back(base + off);  // the top of the stack [off - kStackBytes, off)
    }
  }
  std::vector<void*> arenas_;
  std::vector<char*> free_;
};

StackPool& stack_pool() {
  static thread_local StackPool pool;
  return pool;
}

// Boost.Context's StackAllocator over the pool (copied into each fiber).
struct PoolAllocator {
  ctx::stack_context* last;  // the stack handed out last (for the ASan annotations)
  ctx::stack_context allocate() {
    *last = stack_pool().take();
    return *last;
  }
  void deallocate(ctx::stack_context& sc) noexcept { stack_pool().give(sc); }
};

enum class State { kReady, kBarrier, kGrid, kWarp, kDone };

const char* state_name(State s) {
  switch (s) {
    case State::kReady: return "running";
    case State::kBarrier: return "at __syncthreads";
    case State::kGrid: return "at grid.sync()";
    case State::kWarp: return "at a warp intrinsic";
    case State::kDone: return "exited";
  }
  return "?";
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
  }
  return "?";
}

std::string site(const char* file, int line) {
  std::string f = file ? file : "?";
  const auto cut = f.find("csrc/");
  return (cut == std::string::npos ? f : f.substr(cut)) + ":" + std::to_string(line);
}

struct Block;
struct Run;

// A counted sync point (a block's __syncthreads, the grid's grid.sync()): how many
// threads wait at it, and the call site the first of them reached.
struct Gathering {
  int waiting = 0;
  const char* file = nullptr;
  int line = 0;
  bool other_site(const char* f, int l) const;  // a thread at f:l is at a different call site
  std::string where() const;
};

struct Thread {
  ThreadIndex index{};
  int lane = 0, warp = 0;
  Block* block = nullptr;
  State state = State::kReady;
  ctx::fiber fiber;  // this thread's continuation while it is not running
  ctx::stack_context stack{};
  void* fake_stack = nullptr;
  const char* file = nullptr;  // where it waits
  int line = 0;
  // the warp exchange it waits at (its value, argument and result live in Warp)
  WarpOp op = WarpOp::kShflXor;
  unsigned mask = 0;
  int width = 32;
};

// The lanes of one warp, as bit masks, and the values of the exchange being formed.
struct Warp {
  unsigned exist = 0;    // lanes that exist (blockDim.x need not be a multiple of 32)
  unsigned arrived = 0;  // lanes waiting at a warp exchange
  unsigned stuck = 0;    // lanes that cannot join one: exited, at a barrier or grid sync
  uint64_t bits[32] = {}, result[32] = {};
  int arg[32] = {};
};

struct Block {
  uint3 idx{};
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int live = 0;
  Gathering barrier;
  std::unordered_map<const void*, void*> shared;
  ~Block() {
    threads.clear();  // unwinds fibers that did not finish before their shared memory goes
    for (auto& kv : shared) std::free(kv.second);
  }
};

struct Run {
  Config cfg;
  bool cooperative = false;
  const std::function<void()>* kernel = nullptr;
  std::vector<Block*> blocks;  // resident blocks
  std::vector<Thread*> now;    // this round's threads, in schedule order (next_ready walks it)
  std::size_t pos = 0;
  std::vector<Thread*> ready;  // threads made ready during this round: the next round
  std::vector<Thread*> eager;  // released threads that run before the rest of this round
  std::size_t eager_pos = 0;
  bool release_eager = false;  // the sync point being completed releases into `eager`
  bool aborting = false;       // an error was recorded: suspended fibers are being unwound
  ctx::fiber main;             // run_grid's continuation while a fiber runs
  Thread* from = nullptr;      // who switched last (nullptr: run_grid; kDying: a finished fiber)
  std::mt19937_64 rng;
  std::string error;
  int grid_live = 0;
  Gathering grid;
  const void* main_bottom = nullptr;  // the scheduler's stack (ASan annotations)
  std::size_t main_size = 0;
  void* main_fake = nullptr;
};

// One emulated launch at a time in a process (run_grid holds g_launch_mutex): plain globals.
Thread* g_thread = nullptr;
Run* g_run = nullptr;
std::recursive_mutex g_launch_mutex;  // recursive: a launch from inside a kernel gets an error, not a hang

// State changes that the warp-exchange check reads through Warp::stuck.
SIMT_HOT void set_state(Thread& t, State s) {
  const bool stuck = s == State::kDone || s == State::kBarrier || s == State::kGrid;
  unsigned& m = t.block->warps[t.warp].stuck;
  m = stuck ? (m | 1u << t.lane) : (m & ~(1u << t.lane));
  t.state = s;
}

SIMT_HOT bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || std::strcmp(f1, f2) == 0);
}

bool Gathering::other_site(const char* f, int l) const { return waiting > 0 && !same_site(f, l, file, line); }
std::string Gathering::where() const { return site(file, line); }

// Thread t waits at the sync point g (state s, reached at file:line); returns how many wait.
SIMT_HOT int join(Gathering& g, Thread& t, State s, const char* file, int line) {
  if (g.waiting == 0) {
    g.file = file;
    g.line = line;
  }
  set_state(t, s);
  t.file = file;
  t.line = line;
  return ++g.waiting;
}

SIMT_HOT Thread& self() {
  if (!g_thread) {
    std::fputs("SIMT: a device built-in was used outside a kernel\n", stderr);
    std::abort();
  }
  return *g_thread;
}

std::string who(const Thread& t) {
  std::ostringstream s;
  s << "thread " << t.index.thread_idx.x << " of block " << t.index.block_idx.x;
  return s.str();
}

// Records the first error of the run; the scheduler throws it after the fiber yields.
// Out of line and cold: the sync points' own stack frames stay small (a fiber switch
// touches them).
[[gnu::noinline, gnu::cold]] void fail(const std::string& msg) {
  if (g_run->error.empty()) g_run->error = "SIMT: " + msg;
}

// ---- switching ---------------------------------------------------------------------
// Fibers hand over to each other directly (one switch per sync point, not two through a
// scheduler): at a sync point a thread switches to the next ready thread of the round
// (next_ready), and to run_grid only when no thread is ready or an error was recorded.
// A switch stores the continuation it receives in the Thread (or Run::main) that made
// it, which Run::from names.
Thread* const kDying = reinterpret_cast<Thread*>(1);

void order(Run& run, std::vector<Thread*>& v);

// The next thread to run: threads an eager release put first, the rest of this round,
// then the next round (in schedule order).
SIMT_HOT Thread* next_ready(Run& run) {
  while (run.eager_pos < run.eager.size()) {
    Thread* t = run.eager[run.eager_pos++];
    if (t->state == State::kReady) return t;
  }
  run.eager.clear();
  run.eager_pos = 0;
  for (;;) {
    while (run.pos < run.now.size()) {
      Thread* t = run.now[run.pos++];
      if (t->state == State::kReady) return t;
    }
    if (run.ready.empty()) return nullptr;
    run.now.swap(run.ready);
    run.ready.clear();
    run.pos = 0;
    order(run, run.now);
  }
}

// Called right after a switch into the context of `self` (nullptr: run_grid): keeps the
// continuation of the context that switched here.
SIMT_HOT void arrived(Run& run, Thread* self, ctx::fiber&& back) {
  g_thread = self;
  if (run.from == kDying) return;  // a finished fiber: nothing to keep
  (run.from ? run.from->fiber : run.main) = std::move(back);
}

void asan_start(Run& run, Thread* to, void** fake) {
#if defined(__SANITIZE_ADDRESS__)
  if (to) __sanitizer_start_switch_fiber(fake, static_cast<char*>(to->stack.sp) - to->stack.size, to->stack.size);
  else __sanitizer_start_switch_fiber(fake, run.main_bottom, run.main_size);
#else
  (void)run, (void)to, (void)fake;
#endif
}
void asan_finish(Run& run, Thread* self, void* fake) {
#if defined(__SANITIZE_ADDRESS__)
  // back in run_grid: nothing to learn; in a fiber: run_grid's stack if it came from there
  const void* bottom = nullptr;
  std::size_t size = 0;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  if (self && run.from == nullptr) {
    run.main_bottom = bottom;
    run.main_size = size;
  }
#else
  (void)run, (void)self, (void)fake;
#endif
}

// Thrown inside a suspended fiber that run_grid resumes after an error: unwinds its stack
// (through annotated switches, so ASan follows) and ends it.
struct AbortFiber {};

// From the running context `self` (nullptr: run_grid) to `to` (nullptr: run_grid).
SIMT_HOT void switch_to(Run& run, Thread* self, Thread* to) {
  ctx::fiber& target = to ? to->fiber : run.main;
  void** fake = self ? &self->fake_stack : &run.main_fake;
  run.from = self;
  asan_start(run, to, fake);
  ctx::fiber back = std::move(target).resume();
  asan_finish(run, self, *fake);
  arrived(run, self, std::move(back));
  if (self && run.aborting) throw AbortFiber{};
}

// A sync point of thread `t`: run the next ready thread (maybe `t` itself).
SIMT_HOT void yield(Thread& t) {
  Run& run = *g_run;
  Thread* next = run.error.empty() ? next_ready(run) : nullptr;
  if (next != &t) switch_to(run, &t, next);
}

// A sync point releases `t`: into the next round, or (an eager release, random schedules
// only) ahead of the threads still waiting in this round, so that a fast warp can overtake
// slower ones as on a GPU (a round boundary alone would act as an extra barrier).
SIMT_HOT void make_ready(Thread& t) {
  set_state(t, State::kReady);
  (g_run->release_eager ? g_run->eager : g_run->ready).push_back(&t);
}

// Starts a release event: eager with probability 1/2 under a random schedule.
SIMT_HOT void begin_release(Run& run) {
  run.release_eager = run.cfg.policy == SchedulePolicy::kRandom && (run.rng() & 1u);
}

// A lane of `t`'s warp in `lanes` that cannot take part in a warp exchange: exited or
// waiting at a barrier / grid sync (the exchange would wait for it forever).
[[gnu::noinline, gnu::cold]] void report_unavailable_lane(const Thread& t, unsigned lanes, const char* what,
                                                           const char* file, int line) {
  Block& b = *t.block;
  for (int l = 0; l < 32; ++l) {
    if (!(lanes >> l & 1u)) continue;
    const int i = t.warp * 32 + l;
    if (i >= static_cast<int>(b.threads.size())) {
      fail(std::string(what) + " at " + site(file, line) + " names lane " + std::to_string(l) +
           ", which does not exist (blockDim.x = " + std::to_string(b.threads.size()) + ")");
      return;
    }
    const Thread& o = b.threads[i];
    if (o.state == State::kDone || o.state == State::kBarrier || o.state == State::kGrid) {
      fail(std::string(what) + " at " + site(file, line) + " by " + who(t) + " waits for lane " +
           std::to_string(l) + ", which is " + state_name(o.state) +
           (o.state == State::kDone ? std::string() : " (" + site(o.file, o.line) + ")") +
           ": the warp diverged around a warp intrinsic");
      return;
    }
  }
}

// The source lane of a shuffle by `lane` (op, argument, width); the lane itself when the
// source falls outside its width segment.
SIMT_HOT int shuffle_source(WarpOp op, int lane, int arg, int w) {
  const int seg = lane / w * w;
  int src = lane;
  switch (op) {
    case WarpOp::kShflXor: src = lane ^ arg; if (src >= seg + w) src = lane; break;
    case WarpOp::kShfl: src = seg + ((arg % w) + w) % w; break;
    case WarpOp::kShflDown: src = (lane - seg) + arg >= w ? lane : lane + arg; break;
    case WarpOp::kShflUp: src = (lane - seg) < arg ? lane : lane - arg; break;
    default: break;
  }
  return (src < 0 || src >= 32) ? lane : src;
}

// The exchange of the lanes `mask` of warp `wi` (all arrived, same op / mask / width /
// call site as `t`): every lane's result, and they are ready to run again.
SIMT_HOT void complete_exchange(Block& b, int wi, const Thread& t) {
  Warp& w = b.warps[wi];
  const unsigned mask = t.mask;
  if (t.op == WarpOp::kBallot || t.op == WarpOp::kAny || t.op == WarpOp::kAll) {
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
      if ((mask >> l & 1u) && w.bits[l]) ballot |= 1u << l;
    const uint64_t r = t.op == WarpOp::kBallot ? ballot : t.op == WarpOp::kAny ? (ballot != 0) : (ballot == mask);
    for (int l = 0; l < 32; ++l)
      if (mask >> l & 1u) w.result[l] = r;  // only this exchange's lanes (another group may be waiting)
  } else {
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      const int src = shuffle_source(t.op, l, w.arg[l], t.width);
      if (!(mask >> src & 1u))
        fail(std::string(op_name(t.op)) + " at " + site(t.file, t.line) + ": lane " + std::to_string(l) +
             " reads lane " + std::to_string(src) + ", which is not in the mask");
      w.result[l] = w.bits[src];
    }
  }
  w.arrived &= ~mask;
  begin_release(*g_run);
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) make_ready(b.threads[wi * 32 + l]);
}

// A lane of t's warp waiting at an exchange that needs t, while t is about to wait
// elsewhere or exit (`doing`): that exchange would wait forever.
void check_not_awaited(const Thread& t, const std::string& doing) {
  const Warp& w = t.block->warps[t.warp];
  for (unsigned a = w.arrived; a; a &= a - 1) {
    const int l = __builtin_ctz(a);
    const Thread& o = t.block->threads[t.warp * 32 + l];
    if (o.mask >> t.lane & 1u) {
      fail(who(t) + " " + doing + " while lane " + std::to_string(l) + " of its warp waits for it at " +
           op_name(o.op) + " (" + site(o.file, o.line) + ")");
      return;
    }
  }
}

// Called by the fiber of `t` when its kernel body has returned.
void on_exit(Thread& t) {
  Block& b = *t.block;
  set_state(t, State::kDone);
  --b.live;
  --g_run->grid_live;
  if (b.barrier.waiting > 0)
    fail(who(t) + " exited while other threads of its block wait at __syncthreads (" + b.barrier.where() + ")");
  if (g_run->grid.waiting > 0)
    fail(who(t) + " exited while other threads wait at grid.sync() (" + g_run->grid.where() + ")");
  if (b.warps[t.warp].arrived) check_not_awaited(t, "exited");
}

void order(Run& run, std::vector<Thread*>& v) {
  switch (run.cfg.policy) {
    case SchedulePolicy::kInOrder: break;
    case SchedulePolicy::kReversed: std::reverse(v.begin(), v.end()); break;
    case SchedulePolicy::kRandom:
      for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[run.rng() % i]);  // Fisher-Yates
      break;
  }
}

std::string describe_deadlock(const Run& run) {
  std::ostringstream s;
  s << "deadlock: no thread can proceed.";
  int shown = 0;
  for (const Block* b : run.blocks)
    for (const Thread& t : b->threads)
      if (t.state != State::kDone && shown++ < 4) s << " " << who(t) << " is " << state_name(t.state) << " ("
                                                    << site(t.file, t.line) << ");";
  return s.str();
}

// Runs the resident blocks `run.blocks` to completion.
void execute(Run& run) {
  std::vector<Thread*> all;
  for (Block* b : run.blocks) {
    b->live = static_cast<int>(b->threads.size());
    run.grid_live += b->live;
    for (Thread& t : b->threads) {
      Thread* tp = &t;
      Run* rp = &run;
      t.fiber = ctx::fiber(std::allocator_arg, PoolAllocator{&t.stack}, [tp, rp](ctx::fiber&& back) {
        asan_finish(*rp, tp, nullptr);
        arrived(*rp, tp, std::move(back));
        try {
          if (!rp->aborting) (*rp->kernel)();
        } catch (const AbortFiber&) {
          // unwound after an error (run_grid resumed this suspended fiber to end it)
        } catch (const ctx::detail::forced_unwind&) {
          throw;
        } catch (const std::exception& e) {
          fail(who(*tp) + ": a C++ exception escaped the kernel: " + e.what());
        } catch (...) {
          fail(who(*tp) + ": a C++ exception escaped the kernel");
        }
        if (rp->aborting) set_state(*tp, State::kDone);
        else on_exit(*tp);
        // hand over for good: the next ready thread, else run_grid
        Thread* next = rp->error.empty() ? next_ready(*rp) : nullptr;
        rp->from = kDying;
        asan_start(*rp, next, nullptr);
        return std::move(next ? next->fiber : rp->main);
      });
      all.push_back(&t);
    }
  }
  run.ready = all;
  if (Thread* first = next_ready(run)) switch_to(run, nullptr, first);  // back when no thread can run
  g_thread = nullptr;
  const std::string error = !run.error.empty() ? run.error
                          : run.grid_live > 0  ? "SIMT: " + describe_deadlock(run)
                                               : std::string();
  if (error.empty()) return;
  // End every fiber that did not finish: resumed one by one, each unwinds its stack by an
  // exception from its last switch (annotated for ASan) and hands back to run_grid.
  run.aborting = true;
  if (run.error.empty()) run.error = error;
  for (Thread* t : all)
    if (t->state != State::kDone && t->fiber) switch_to(run, nullptr, t);
  g_thread = nullptr;
  throw std::runtime_error(error);
}

}  // namespace

SIMT_HOT const ThreadIndex& current_index() { return self().index; }

[[gnu::noinline]] SIMT_HOT void arrive_at_barrier(Thread& t, const char* file, int line) {
  Block& b = *t.block;
  if (b.live < static_cast<int>(b.threads.size())) {
    fail(who(t) + " reached __syncthreads (" + site(file, line) + ") after other threads of its block exited");
  } else if (b.barrier.other_site(file, line)) {
    fail("threads of block " + std::to_string(t.index.block_idx.x) + " reach different barriers: " + who(t) +
         " at __syncthreads (" + site(file, line) + "), others wait at " + b.barrier.where());
  } else if (b.warps[t.warp].arrived) {
    check_not_awaited(t, "reached __syncthreads (" + site(file, line) + ")");
  }
  if (join(b.barrier, t, State::kBarrier, file, line) == b.live) {
    b.barrier.waiting = 0;
    begin_release(*g_run);
    for (Thread& o : b.threads)
      if (o.state == State::kBarrier) make_ready(o);
  }
}

SIMT_HOT void syncthreads(const char* file, int line) {
  Thread& t = self();
  arrive_at_barrier(t, file, line);
  yield(t);
}

[[gnu::noinline]] void arrive_at_grid_sync(Thread& t, const char* file, int line) {
  Run& run = *g_run;
  if (!run.cooperative) {
    fail(who(t) + " called grid.sync() (" + site(file, line) + ") in a kernel that was not launched cooperatively");
  } else if (run.grid.other_site(file, line)) {
    fail("threads reach different grid.sync() calls: " + who(t) + " at " + site(file, line) + ", others at " +
         run.grid.where());
  }
  if (t.block->warps[t.warp].arrived) check_not_awaited(t, "reached grid.sync() (" + site(file, line) + ")");
  if (join(run.grid, t, State::kGrid, file, line) == run.grid_live) {
    int total = 0;
    for (Block* b : run.blocks) total += static_cast<int>(b->threads.size());
    if (run.grid_live != total) fail("grid.sync() reached after some threads of the grid exited");
    run.grid.waiting = 0;
    begin_release(run);
    for (Block* b : run.blocks)
      for (Thread& o : b->threads)
        if (o.state == State::kGrid) make_ready(o);
  }
}

void grid_sync(const char* file, int line) {
  Thread& t = self();
  arrive_at_grid_sync(t, file, line);
  yield(t);
}

// The arrival of `t` at a warp exchange: checks, and the results when it completes it.
// (The sync points split into an out-of-line arrival and the switch, so that the stack
// frame live across the switch is small: a switch touches it.)
[[gnu::noinline, gnu::cold]] void report_mismatch(const Thread& t, const Thread& o, int l) {
  fail("lanes of one warp meet at different warp intrinsics: " + who(t) + " at " + op_name(t.op) + " (" +
       site(t.file, t.line) + ", mask " + std::to_string(t.mask) + "), lane " + std::to_string(l) + " at " +
       op_name(o.op) + " (" + site(o.file, o.line) + ", mask " + std::to_string(o.mask) + ")");
}

SIMT_HOT bool same_exchange(const Thread& a, const Thread& b) {
  return a.op == b.op && a.mask == b.mask && a.width == b.width && same_site(a.file, a.line, b.file, b.line);
}

[[gnu::noinline]] SIMT_HOT void arrive_at_exchange(Thread& t, WarpOp op, unsigned mask, uint64_t bits, int arg, int width,
                                          const char* file, int line) {
  Block& b = *t.block;
  Warp& w = b.warps[t.warp];
  const unsigned me = 1u << t.lane;
  if (!(mask & me))
    fail(std::string(op_name(op)) + " at " + site(file, line) + " by " + who(t) + ": the mask " +
         std::to_string(mask) + " does not include the calling lane");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    fail(std::string(op_name(op)) + " at " + site(file, line) + ": width " + std::to_string(width) +
         " is not a power of 2 in [1, 32]");
  set_state(t, State::kWarp);
  t.op = op;
  t.mask = mask;
  t.width = width;
  t.file = file;
  t.line = line;
  // Lanes already waiting that this exchange involves: one in our mask must be at the same
  // exchange (all of them are, once the first is checked: each was checked on arrival), and
  // one outside our mask must not be waiting for us.
  if (const unsigned in = w.arrived & mask) {
    const int l = __builtin_ctz(in);
    const Thread& o = b.threads[t.warp * 32 + l];
    if (!same_exchange(t, o)) report_mismatch(t, o, l);
  }
  for (unsigned out = w.arrived & ~mask; out; out &= out - 1) {
    const int l = __builtin_ctz(out);
    const Thread& o = b.threads[t.warp * 32 + l];
    if (o.mask & me) report_mismatch(t, o, l);
  }
  if (mask & ~me & (w.stuck | ~w.exist)) report_unavailable_lane(t, mask & ~me, op_name(op), file, line);
  w.bits[t.lane] = bits;
  w.arg[t.lane] = arg;
  w.arrived |= me;
  if ((w.arrived & mask) == mask && g_run->error.empty()) complete_exchange(b, t.warp, t);
}

SIMT_HOT uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, const char* file, int line) {
  Thread& t = self();
  arrive_at_exchange(t, op, mask, bits, arg, width, file, line);
  yield(t);
  return t.block->warps[t.warp].result[t.lane];
}

void* block_shared(const void* key, std::size_t bytes, std::size_t align) {
  Block& b = *self().block;
  auto it = b.shared.find(key);
  if (it != b.shared.end()) return it->second;
  const std::size_t a = std::max<std::size_t>(align, alignof(std::max_align_t));
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0xFF, bytes);  // poison: a read before the block writes it sees NaN / -1
  b.shared.emplace(key, p);
  return p;
}

LaunchCounts& launch_counts() {
  static LaunchCounts counts;
  return counts;
}

bool env_flag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  if (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0) return *v == '1';
  throw std::runtime_error(std::string(name) + " must be 0 or 1, got '" + v + "'");
}

Config config_from_env() {
  Config c;
  auto count = [](const char* name, int dflt) {
    const char* v = std::getenv(name);
    if (!v || !*v) return dflt;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 4096)
      throw std::runtime_error(std::string(name) + " must be an integer in [1, 4096], got '" + v + "'");
    return static_cast<int>(n);
  };
  c.sms = count("SPECDEC_SIMT_SMS", c.sms);
  c.blocks_per_sm = count("SPECDEC_SIMT_BLOCKS_PER_SM", c.blocks_per_sm);
  const char* coop = std::getenv("SPECDEC_SIMT_COOPERATIVE");
  c.refuse_cooperative = coop && std::strcmp(coop, "refuse") == 0;
  c.cooperative = c.refuse_cooperative || env_flag("SPECDEC_SIMT_COOPERATIVE", true);
  const char* s = std::getenv("SPECDEC_SIMT_SCHEDULE");
  const std::string sched = s ? s : "";
  if (sched.empty() || sched == "inorder") {
    c.policy = SchedulePolicy::kInOrder;
  } else if (sched == "reversed") {
    c.policy = SchedulePolicy::kReversed;
  } else {
    char* end = nullptr;
    c.seed = std::strtoull(sched.c_str(), &end, 10);
    if (!end || *end != '\0')
      throw std::runtime_error("SPECDEC_SIMT_SCHEDULE must be inorder, reversed or an integer seed, got '" + sched +
                               "'");
    c.policy = SchedulePolicy::kRandom;
  }
  return c;
}

void run_grid(dim3 grid, dim3 block, bool cooperative, const Config& cfg, const std::function<void()>& kernel) {
  const std::lock_guard<std::recursive_mutex> lock(g_launch_mutex);
  if (g_run) throw std::runtime_error("SIMT: a kernel launch from inside a kernel");
  if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1)
    throw std::runtime_error("SIMT: only 1-D grids and blocks are emulated");
  if (grid.x == 0 || block.x == 0 || block.x > 1024)
    throw std::runtime_error("SIMT: invalid launch configuration (grid " + std::to_string(grid.x) + ", block " +
                             std::to_string(block.x) + ")");
  const int nb = static_cast<int>(grid.x), nt = static_cast<int>(block.x);
  std::vector<int> block_order(nb);
  for (int i = 0; i < nb; ++i) block_order[i] = i;
  std::mt19937_64 rng(cfg.seed * 0x9E3779B97F4A7C15ull + 1);
  if (cfg.policy == SchedulePolicy::kReversed) std::reverse(block_order.begin(), block_order.end());
  if (cfg.policy == SchedulePolicy::kRandom)
    for (int i = nb; i > 1; --i) std::swap(block_order[i - 1], block_order[rng() % i]);
  // cooperative: every block resident, in index order (the schedule orders their threads
  // together); else one block at a time, in the schedule's block order
  if (cooperative) std::sort(block_order.begin(), block_order.end());
  const int resident = cooperative ? nb : 1;
  for (int first = 0; first < nb; first += resident) {
    Run run;
    run.cfg = cfg;
    run.cooperative = cooperative;
    run.kernel = &kernel;
    run.rng = std::mt19937_64(rng());
    std::vector<std::unique_ptr<Block>> blocks;
    for (int k = first; k < first + resident; ++k) {
      auto b = std::make_unique<Block>();
      b->idx = uint3{static_cast<unsigned>(block_order[k]), 0u, 0u};
      b->threads.resize(nt);
      b->warps.assign((nt + 31) / 32, Warp{});
      for (int w = 0; w < (nt + 31) / 32; ++w) {
        const int in_warp = std::min(32, nt - w * 32);
        b->warps[w].exist = in_warp == 32 ? 0xffffffffu : ((1u << in_warp) - 1u);
      }
      for (int i = 0; i < nt; ++i) {
        Thread& t = b->threads[i];
        t.index = ThreadIndex{uint3{static_cast<unsigned>(i), 0u, 0u}, b->idx, dim3(nt), dim3(nb)};
        t.lane = i & 31;
        t.warp = i >> 5;
        t.block = b.get();
      }
      run.blocks.push_back(b.get());
      blocks.push_back(std::move(b));
    }
    g_run = &run;
    try {
      execute(run);
    } catch (...) {
      blocks.clear();  // unwinds the fibers that did not finish, while g_run is set
      g_run = nullptr;
      throw;
    }
    g_run = nullptr;
  }
}

}  // namespace simt
