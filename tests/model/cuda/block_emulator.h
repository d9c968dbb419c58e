// Runs a CUDA kernel's source on the CPU, for the tests: each block's threads
// are fibers on the calling thread, switched at __syncthreads and at warp
// shuffles, so that a kernel compiled as C++ (include/cuda_runtime.h) can be
// checked against its CPU form where no GPU is lent.
//
// The order is one a GPU may take, chosen to expose missing barriers and
// drawn from a seed (SetOrderSeed): blocks one at a time in a shuffled order
// (so that different blocks are last to finish a job); in a block, one warp
// at a time runs ahead as far as the block's barrier, its shuffles opening
// as soon as its 32 lanes reach them; its lanes run in a shuffled order
// between barriers. Warps never interleave between barriers, so a race in
// which one warp reads another's passing value shows only under TSan. What
// it checks beyond the results:
//   - dynamic shared memory starts each block as NaN bytes, so a read
//     before a write shows, and is exactly its size, so ASan sees an
//     overrun; static (__shared__) memory is NaN bytes too where the
//     compiler keeps it in its section (clang; GCC 12 does not in function
//     templates, whose statics then keep the last block's values), and ASan
//     does not check it;
//   - a barrier some threads never reach (a shuffle in divergent code, a
//     __syncthreads after some threads exited, threads at different
//     __syncthreads or shuffle lines) stops the process, naming where each
//     thread waits;
//   - a launch CUDA would refuse (over 1024 threads a block, over 48 KB of
//     dynamic shared memory, a grid's y or z over 65535) is refused, and
//     cudaGetLastError says so (the limit counts no static shared memory);
//   - under TSan, only a __syncthreads orders memory between threads (a
//     shuffle does not): a read of another thread's write to shared memory,
//     or a write over another thread's read, with no barrier between is a
//     race. TSan (clang 14) keeps history for at most 256 threads at once,
//     the caller's among them, so in a block of 256 it may forget and miss
//     one.
// Not modelled: anything between blocks (they run one after another, each
// seeing every earlier one's writes), the device's memory ordering, timing.
#ifndef TXL_TESTS_MODEL_CUDA_BLOCK_EMULATOR_H_
#define TXL_TESTS_MODEL_CUDA_BLOCK_EMULATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace txl_emu {

struct Dim3 {
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  unsigned x, y, z;
};

// Runs `body` once for every thread of every block. Returns 0, or the CUDA
// error code of a launch CUDA would refuse (nothing runs then).
int Launch(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body);

// The seed of later launches' orders: of their blocks, of the warps that run
// in a block, and of a warp's lanes. 0: in order. 1 until set.
void SetOrderSeed(uint64_t seed);

// The launch error since the last call (cudaGetLastError), then cleared.
int TakeLaunchError();

// The running thread's view, inside a launch.
Dim3 ThreadIndex();
Dim3 BlockIndex();
Dim3 BlockDim();
Dim3 GridDim();
void* DynamicShared();
// At a barrier's source line: threads that wait at different ones fail.
void SyncThreads(const char* file, int line);
float ShuffleFloatXor(unsigned mask, float value, int lane_mask, const char* file, int line);
// __shfl_xor_sync: float only, so that a kernel shuffling another type fails
// to compile here rather than round through float.
template <typename T>
T ShuffleXor(unsigned mask, T value, int lane_mask, const char* file, int line) {
  static_assert(std::is_same_v<T, float>, "the block emulator shuffles float only: add the type");
  return ShuffleFloatXor(mask, value, lane_mask, file, line);
}

// kernel<<<grid, block, shared_bytes>>>(arguments...): the arguments copied,
// as a launch copies them.
template <typename... P>
struct KernelCall {
  Dim3 grid, block;
  size_t shared_bytes;
  void (*kernel)(P...);

  template <typename... A>
  void operator()(A&&... arguments) const {
    std::tuple<P...> copied(std::forward<A>(arguments)...);
    Launch(grid, block, shared_bytes, [&] { std::apply(kernel, copied); });
  }
};

template <typename... P>
KernelCall<P...> MakeKernelCall(Dim3 grid, Dim3 block, size_t shared_bytes, void (*kernel)(P...)) {
  return KernelCall<P...>{grid, block, shared_bytes, kernel};
}

}  // namespace txl_emu

#endif  // TXL_TESTS_MODEL_CUDA_BLOCK_EMULATOR_H_
