// The block emulator (block_emulator.h): fibers (fiber_context.h), one per
// thread of the running block, and a scheduler that runs each until it waits at a
// barrier, then releases the barriers every thread has reached.
#include "tests/model/cuda/block_emulator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/model/cuda/fiber_context.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TXL_EMU_TSAN 1
#endif
#if __has_feature(address_sanitizer)
#define TXL_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TXL_EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TXL_EMU_ASAN 1
#endif

#if defined(TXL_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
#endif
#if defined(TXL_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(TXL_EMU_TSAN)
// TSan's dynamic annotations (its runtime defines them; no header declares them).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace txl_emu {
namespace {

// CUDA's error codes for the refusals the emulator models.
constexpr int kInvalidValue = 1;          // cudaErrorInvalidValue
constexpr int kInvalidConfiguration = 9;  // cudaErrorInvalidConfiguration

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 64 * 1024;  // room for ASan's frames too (a kernel's own are small)
constexpr size_t kMaxDynamicShared = 48 * 1024;

enum class Wait { kNone, kBlock, kWarp, kDone };

// Where a thread waits: the barrier's source line.
struct Site {
  const char* file = "";
  int line = 0;
  bool operator==(const Site& o) const { return line == o.line && std::strcmp(file, o.file) == 0; }
};

struct Fiber {
  FiberContext context;
  char* stack = nullptr;  // kStackBytes of Stacks()
  Wait wait = Wait::kNone;
  Site site;
  Dim3 index;
  void* tsan = nullptr;  // TSan's fiber
  // ASan's fake stack (the frames of detect_stack_use_after_return) while the
  // fiber is switched out, kept with its stack from block to block.
  void* fake_stack = nullptr;
};

// One launch: its fibers, the running block and the barriers' state.
struct Run {
  Dim3 grid, block, block_index;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  int current = -1;
  std::mt19937_64 order;  // the seed's: which warp runs, and its lanes' order
  FiberContext scheduler;
  void* scheduler_tsan = nullptr;
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;  // ASan: the scheduler's stack, learnt by the first fiber to start
  size_t scheduler_stack_bytes = 0;
  std::unique_ptr<unsigned char[]> shared;
  std::vector<float> exchange;  // a shuffle's value per thread
  int64_t block_rounds = 0;     // __syncthreads the block has passed
  // TSan's synchronisation objects (their addresses): the block's barrier,
  // two so that a round's release reaches only that round's acquires, and
  // the start and the end of a block. A shuffle orders no memory (only
  // __syncwarp would), so it has none.
  std::vector<char> sync;
};

// Under TSan, the emulator's own reads and writes while a thread runs
// (which thread runs, which waits, a shuffle's exchange) are not recorded:
// only the kernel's are, so that only the kernel's races are reported.
class Bookkeeping {
 public:
  Bookkeeping() {
#if defined(TXL_EMU_TSAN)
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  }
  ~Bookkeeping() {
#if defined(TXL_EMU_TSAN)
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  }
  Bookkeeping(const Bookkeeping&) = delete;
  Bookkeeping& operator=(const Bookkeeping&) = delete;
};

// The kernels' static shared memory (include/cuda_runtime.h's __shared__):
// the linker's bounds of its section; weak, so both are null (an empty
// section) in a program whose kernels have none.
extern "C" char __start_txl_emu_shared[] __attribute__((weak));
extern "C" char __stop_txl_emu_shared[] __attribute__((weak));

thread_local Run* running = nullptr;

// The fibers' stacks, kept from launch to launch (a block of 1,024 threads
// takes 64 MB of them), each with its fake stack under ASan: a fiber that
// ended its block with its fake stack given up (destroyed) would map a new
// one in its next, which made the model's tests under
// detect_stack_use_after_return ten times slower.
struct Stack {
  std::unique_ptr<char[]> bytes;
  void* fake_stack = nullptr;
};
std::vector<Stack>& Stacks() {
  static thread_local std::vector<Stack> stacks;
  return stacks;
}
uint64_t order_seed = 1;
int last_error = 0;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "block emulator: %s\n", what.c_str());
  std::abort();
}

// Out of line, so that Current (called for every threadIdx and barrier)
// builds no string, and takes no frame of ASan's fake stack.
[[noreturn]] __attribute__((noinline)) void FailOutsideAKernel(const char* what) {
  Fail(std::string(what) + " outside a kernel");
}

Run& Current(const char* what) {
  if (running == nullptr || running->current < 0) FailOutsideAKernel(what);
  return *running;
}

// TSan keys a synchronisation object by its 8-byte cell: one cell each.
constexpr size_t kSyncStride = 8;
char* SyncObject(Run& r, size_t i) { return &r.sync[i * kSyncStride]; }
char* BlockSync(Run& r, int64_t round) { return SyncObject(r, round % 2); }
char* StartSync(Run& r) { return SyncObject(r, 2); }
char* EndSync(Run& r) { return SyncObject(r, 3); }

void Release(void* sync) {
#if defined(TXL_EMU_TSAN)
  __tsan_release(sync);
#else
  (void)sync;
#endif
}

void Acquire(void* sync) {
#if defined(TXL_EMU_TSAN)
  __tsan_acquire(sync);
#else
  (void)sync;
#endif
}

// From the running fiber to the scheduler, until the scheduler resumes it.
void ToScheduler(Run& r) {
  Fiber& f = r.fibers[r.current];
#if defined(TXL_EMU_TSAN)
  __tsan_switch_to_fiber(r.scheduler_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(TXL_EMU_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, r.scheduler_stack, r.scheduler_stack_bytes);
#endif
  SwitchFiberContext(&f.context, &r.scheduler);
#if defined(TXL_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

// From the scheduler to fiber t, until it waits or ends.
void ToFiber(Run& r, int t) {
  Fiber& f = r.fibers[t];
  r.current = t;
#if defined(TXL_EMU_TSAN)
  __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(TXL_EMU_ASAN)
  __sanitizer_start_switch_fiber(&r.scheduler_fake_stack, f.stack, kStackBytes);
#endif
  SwitchFiberContext(&r.scheduler, &f.context);
#if defined(TXL_EMU_ASAN)
  __sanitizer_finish_switch_fiber(r.scheduler_fake_stack, nullptr, nullptr);
#endif
  r.current = -1;
}

void FinishBlock(Run& r);

// A fiber's first and last frames are never on ASan's fake stack: they
// never return, so their fake frames would stay taken in the fake stack that
// the fiber keeps for its next block.
#if defined(TXL_EMU_ASAN)
#define TXL_EMU_NO_FAKE_FRAME __attribute__((no_sanitize("address")))
#else
#define TXL_EMU_NO_FAKE_FRAME
#endif

TXL_EMU_NO_FAKE_FRAME void FiberEntry() {
  Run* r = nullptr;
  {
    Bookkeeping quiet;
    r = running;
#if defined(TXL_EMU_ASAN)
    __sanitizer_finish_switch_fiber(r->fibers[r->current].fake_stack, &r->scheduler_stack, &r->scheduler_stack_bytes);
#endif
  }
  FinishBlock(*r);
}

// The rest of a thread's run, after FiberEntry has found its Run. Under
// TSan a fiber must end with its ignores ended, so the last switch reads
// nothing of the Run once they are: what it needs is copied first.
TXL_EMU_NO_FAKE_FRAME void FinishBlock(Run& r) {
  Acquire(StartSync(r));
  (*r.body)();
  FiberContext *self = nullptr, *scheduler = nullptr;
  void* end = nullptr;
  void* scheduler_tsan = nullptr;
  void** fake_stack = nullptr;
  {
    Bookkeeping quiet;
    Fiber& f = r.fibers[r.current];
    f.wait = Wait::kDone;
    self = &f.context;
    fake_stack = &f.fake_stack;
    scheduler = &r.scheduler;
    end = EndSync(r);
    scheduler_tsan = r.scheduler_tsan;
  }
  Release(end);
#if defined(TXL_EMU_TSAN)
  __tsan_switch_to_fiber(scheduler_tsan, __tsan_switch_to_fiber_no_sync);
#else
  (void)scheduler_tsan;
#endif
#if defined(TXL_EMU_ASAN)
  // Every frame the body took on the fake stack has returned: the fake stack
  // is kept, empty, for the fiber's next block.
  __sanitizer_start_switch_fiber(fake_stack, r.scheduler_stack, r.scheduler_stack_bytes);
#else
  (void)fake_stack;
#endif
  SwitchFiberContext(self, scheduler);
  Fail("a finished thread was resumed");
}

// Waits at the running thread's block barrier or its warp's, at `site`.
void Arrive(Wait wait, Site site) {
  Bookkeeping quiet;
  Run& r = *running;
  const int t = r.current;
  void* sync = wait == Wait::kBlock ? BlockSync(r, r.block_rounds) : nullptr;
  if (sync != nullptr) Release(sync);
  r.fibers[t].wait = wait;
  r.fibers[t].site = site;
  ToScheduler(r);
  if (sync != nullptr) Acquire(sync);
}

std::string Describe(const Run& r) {
  std::string s = "block (" + std::to_string(r.block_index.x) + ", " + std::to_string(r.block_index.y) + ", " +
                  std::to_string(r.block_index.z) + "):";
  for (size_t t = 0; t < r.fibers.size(); ++t) {
    const Fiber& f = r.fibers[t];
    s += " " + std::to_string(t);
    if (f.wait == Wait::kBlock || f.wait == Wait::kWarp) {
      const char* slash = std::strrchr(f.site.file, '/');
      s += std::string(f.wait == Wait::kBlock ? "@syncthreads:" : "@shuffle:") +
           (slash != nullptr ? slash + 1 : f.site.file) + ":" + std::to_string(f.site.line);
    } else {
      s += f.wait == Wait::kDone ? "@exited" : "@running";
    }
  }
  return s;
}

// Runs warp w's lanes, in the seed's order, until none can run: its
// shuffles open as soon as its 32 lanes reach them, so that a warp runs
// ahead of the others as far as the block's barrier (as a GPU may run it).
void RunWarp(Run& r, int w) {
  std::vector<int> lanes(kWarp);
  for (;;) {
    std::iota(lanes.begin(), lanes.end(), w * kWarp);
    if (order_seed != 0) std::shuffle(lanes.begin(), lanes.end(), r.order);
    bool ran = false;
    for (const int t : lanes) {
      if (r.fibers[t].wait != Wait::kNone) continue;
      ToFiber(r, t);
      ran = true;
    }
    const Fiber& first = r.fibers[w * kWarp];
    int at_shuffle = 0;
    for (int t = w * kWarp; t < (w + 1) * kWarp; ++t) at_shuffle += r.fibers[t].wait == Wait::kWarp;
    if (at_shuffle == kWarp) {
      for (int t = w * kWarp; t < (w + 1) * kWarp; ++t) {
        if (!(r.fibers[t].site == first.site)) Fail("a warp's lanes at different shuffles: " + Describe(r));
      }
      for (int t = w * kWarp; t < (w + 1) * kWarp; ++t) r.fibers[t].wait = Wait::kNone;
      continue;
    }
    if (ran) continue;
    // No lane can run: a shuffle that some lanes wait at can never open.
    if (at_shuffle > 0) Fail("a barrier that not every thread reaches: " + Describe(r));
    return;
  }
}

// Opens the block's barrier where every thread waits there, at one
// __syncthreads; fails where that cannot happen.
void ReleaseBlock(Run& r) {
  const Fiber& first = r.fibers.front();
  for (const Fiber& f : r.fibers) {
    if (f.wait != Wait::kBlock || !(f.site == first.site)) {
      Fail(std::string(f.wait == Wait::kDone ? "a __syncthreads after some threads exited: "
                                             : "a barrier that not every thread reaches: ") +
           Describe(r));
    }
  }
  for (Fiber& f : r.fibers) f.wait = Wait::kNone;
  ++r.block_rounds;
}

void RunBlock(Run& r) {
  const int n = static_cast<int>(r.fibers.size());
  const Dim3& b = r.block;
  for (int t = 0; t < n; ++t) {
    Fiber& f = r.fibers[t];
    f.wait = Wait::kNone;
    f.index = Dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
#if defined(TXL_EMU_ASAN)
    // The last block's frames never returned: their redzones are poisoned.
    __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
#if defined(TXL_EMU_TSAN)
    f.tsan = __tsan_create_fiber(0);  // a new thread for TSan, with no history
#endif
    MakeFiberContext(&f.context, f.stack, kStackBytes, FiberEntry);
  }
  r.block_rounds = 0;
  Release(StartSync(r));
  const int warps = n / kWarp;
  std::vector<int> ready;
  for (;;) {
    // The warps with a lane that can run; one of them, by the seed, runs.
    ready.clear();
    for (int w = 0; w < warps; ++w) {
      for (int t = w * kWarp; t < (w + 1) * kWarp; ++t) {
        if (r.fibers[t].wait == Wait::kNone) {
          ready.push_back(w);
          break;
        }
      }
    }
    if (!ready.empty()) {
      RunWarp(r, order_seed == 0 ? ready.front() : ready[r.order() % ready.size()]);
      continue;
    }
    if (std::all_of(r.fibers.begin(), r.fibers.end(), [](const Fiber& f) { return f.wait == Wait::kDone; })) break;
    ReleaseBlock(r);
  }
  Acquire(EndSync(r));
#if defined(TXL_EMU_TSAN)
  for (Fiber& f : r.fibers) __tsan_destroy_fiber(f.tsan);
#endif
}

}  // namespace

void SetOrderSeed(uint64_t seed) { order_seed = seed; }

int TakeLaunchError() {
  const int e = last_error;
  last_error = 0;
  return e;
}

int Launch(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (running != nullptr) Fail("a launch from inside a kernel");
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  int error = 0;
  if (threads == 0 || threads > 1024 || block.z > 64 || blocks == 0 || grid.y > 65535 || grid.z > 65535)
    error = kInvalidConfiguration;
  if (shared_bytes > kMaxDynamicShared) error = kInvalidValue;
  if (error == 0 && threads % kWarp != 0)
    Fail("the emulator runs whole warps only: a block of " + std::to_string(threads));
  if (error != 0) {
    last_error = error;
    return error;
  }
  Run r;
  r.grid = grid;
  r.block = block;
  r.body = &body;
  r.fibers.resize(threads);
  std::vector<Stack>& stacks = Stacks();
  while (stacks.size() < threads) stacks.push_back(Stack{std::unique_ptr<char[]>(new char[kStackBytes])});
  for (uint64_t t = 0; t < threads; ++t) {
    r.fibers[t].stack = stacks[t].bytes.get();
    r.fibers[t].fake_stack = stacks[t].fake_stack;
  }
#if defined(TXL_EMU_TSAN)
  r.scheduler_tsan = __tsan_get_current_fiber();
#endif
  // The scheduler's reads and writes are its own (what the caller wrote
  // before the launch reaches every block through StartSync).
  Bookkeeping quiet;
  r.exchange.assign(threads, 0.0f);
  r.sync.assign(4 * kSyncStride, 0);
  r.order.seed(order_seed);

  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (order_seed != 0) std::shuffle(order.begin(), order.end(), r.order);
  running = &r;
  for (const uint64_t i : order) {
    r.block_index = Dim3(i % grid.x, i / grid.x % grid.y, i / (uint64_t{grid.x} * grid.y));
    // A new block's shared memory: exactly its size, every byte 0xff (a
    // float NaN) until the kernel writes it.
    r.shared.reset(new unsigned char[std::max<size_t>(shared_bytes, 1)]);
    std::memset(r.shared.get(), 0xff, std::max<size_t>(shared_bytes, 1));
    if (__start_txl_emu_shared != nullptr) {
      std::memset(__start_txl_emu_shared, 0xff, __stop_txl_emu_shared - __start_txl_emu_shared);
    }
    RunBlock(r);
  }
  for (uint64_t t = 0; t < threads; ++t) stacks[t].fake_stack = r.fibers[t].fake_stack;
  running = nullptr;
  return 0;
}

Dim3 ThreadIndex() {
  Bookkeeping quiet;
  const Run& r = Current("threadIdx");
  return r.fibers[r.current].index;
}

Dim3 BlockIndex() {
  Bookkeeping quiet;
  return Current("blockIdx").block_index;
}

Dim3 BlockDim() {
  Bookkeeping quiet;
  return Current("blockDim").block;
}

Dim3 GridDim() {
  Bookkeeping quiet;
  return Current("gridDim").grid;
}

void* DynamicShared() {
  Bookkeeping quiet;
  return Current("dynamic shared memory").shared.get();
}

void SyncThreads(const char* file, int line) {
  Bookkeeping quiet;
  Current("__syncthreads");
  Arrive(Wait::kBlock, Site{file, line});
}

float ShuffleFloatXor(unsigned mask, float value, int lane_mask, const char* file, int line) {
  Bookkeeping quiet;
  Run& r = Current("__shfl_xor_sync");
  if (mask != 0xffffffffu) Fail("the emulator shuffles whole warps only (mask " + std::to_string(mask) + ")");
  if (lane_mask < 0 || lane_mask >= kWarp) Fail("a lane mask outside the warp: " + std::to_string(lane_mask));
  const int t = r.current;
  r.exchange[t] = value;
  Arrive(Wait::kWarp, Site{file, line});  // every lane has written
  const float got = r.exchange[(t / kWarp) * kWarp + ((t % kWarp) ^ lane_mask)];
  Arrive(Wait::kWarp, Site{file, line});  // every lane has read, before the next shuffle writes
  return got;
}

}  // namespace txl_emu
