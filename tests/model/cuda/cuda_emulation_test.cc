// Our CUDA kernels' sources, run on the CPU by the block emulator
// (block_emulator.h), against their CPU forms: where no GPU is lent, this is
// what checks the kernels' indexing, vector loads, barriers and the last
// block's combination before a device runs them (model_test's
// TheCudaKernelMatchesTheCpuForm tests, which check the same on a GPU). And
// the emulator's own behaviour: barriers, shuffles, refusals, block order.
//
// Torch-free, so that the TSan phase (scripts/test.sh) builds and runs it:
// there, a read of another thread's shared-memory write with no barrier
// between is reported, or a write over another warp's read
// (tsan_selftest_cuda_emulation_* prove it), in blocks of up to 128 threads
// (block_emulator.h says why not 256).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "model/cuda/residual_layer_norm.h"
#include "model/cuda/skinny_product.h"
#include "model/cuda/split_decode_attention.h"
#include "model/kernels/host_device.h"

namespace txl {
namespace {

// ---- The emulator ----

__global__ void RecordIndices(int* seen, unsigned* dims) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  ++seen[block * threads + thread];
  if (block == 0 && thread == 0) {
    dims[0] = gridDim.x;
    dims[1] = gridDim.y;
    dims[2] = gridDim.z;
    dims[3] = blockDim.x;
    dims[4] = blockDim.y;
    dims[5] = blockDim.z;
  }
}

TEST(BlockEmulatorTest, RunsEveryThreadOfEveryBlockOnce) {
  const dim3 grid(3, 2, 2), block(32, 2, 2);
  std::vector<int> seen(12 * 128, 0);
  std::vector<unsigned> dims(6, 0);
  TXL_LAUNCH_KERNEL(grid, block, 0, nullptr, RecordIndices)(seen.data(), dims.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()));
  EXPECT_EQ(dims, (std::vector<unsigned>{3, 2, 2, 32, 2, 2}));
}

// Each thread writes its slot of shared memory, then reads its neighbour's.
// Without the barrier, thread 0 would run to its end first and read slot 1
// before thread 1 wrote it (the emulator's NaN bytes).
__global__ void ReadNeighbourAfterBarrier(float* out) {
  TXL_DYNAMIC_SHARED(float, slots);
  const unsigned t = threadIdx.x, n = blockDim.x;
  slots[t] = 2.0f * t + blockIdx.x;
  __syncthreads();
  out[blockIdx.x * n + t] = slots[(t + 1) % n];
}

TEST(BlockEmulatorTest, ABarrierShowsEveryThreadsWrites) {
  std::vector<float> out(2 * 64, -1.0f);
  TXL_LAUNCH_KERNEL(2, 64, 64 * sizeof(float), nullptr, ReadNeighbourAfterBarrier)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[b * 64 + t], 2.0f * ((t + 1) % 64) + b) << b << ", " << t;
}

__global__ void Shuffles(float* out) {
  const unsigned t = threadIdx.x;
  out[t] = __shfl_xor_sync(0xffffffffu, static_cast<float>(t), 5);
  float sum = static_cast<float>(t);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  out[blockDim.x + t] = sum;
}

TEST(BlockEmulatorTest, ShufflesExchangeWithinAWarp) {
  std::vector<float> out(2 * 96, -1.0f);
  TXL_LAUNCH_KERNEL(1, 96, 0, nullptr, Shuffles)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 96; ++t) {
    EXPECT_EQ(out[t], static_cast<float>(t ^ 5)) << t;
    const int first = t / 32 * 32;  // the warp's lanes first .. first + 31
    EXPECT_EQ(out[96 + t], static_cast<float>(32 * first + 31 * 32 / 2)) << t;
  }
}

__global__ void CountThreads(int* count) { atomicAdd(count, 1); }

TEST(BlockEmulatorTest, RefusesTheLaunchesCudaRefuses) {
  int count = 0;
  TXL_LAUNCH_KERNEL(1, 32, 48 * 1024 + 4, nullptr, CountThreads)(&count);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is cleared once read";
  TXL_LAUNCH_KERNEL(1, 1056, 0, nullptr, CountThreads)(&count);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  TXL_LAUNCH_KERNEL(dim3(1, 65536), 32, 0, nullptr, CountThreads)(&count);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  TXL_LAUNCH_KERNEL(dim3(1, 1, 65536), 32, 0, nullptr, CountThreads)(&count);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(count, 0) << "a refused launch runs nothing";
  TXL_LAUNCH_KERNEL(dim3(2, 3), 1024, 48 * 1024, nullptr, CountThreads)(&count);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(count, 6 * 1024);
}

// Launches `kernel` on one block of `threads` and expects the emulator to
// stop with `report`.
void ExpectLaunchStops(void (*kernel)(float*), unsigned threads, const char* report) {
  std::vector<float> out(threads);
  EXPECT_DEATH(TXL_LAUNCH_KERNEL(1, threads, 0, nullptr, kernel)(out.data()), report);
}

__global__ void HalfWarpShuffles(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(BlockEmulatorDeathTest, StopsAtAShuffleNotEveryLaneReaches) {
  ExpectLaunchStops(HalfWarpShuffles, 32,
                    "a barrier that not every thread reaches: block \\(0, 0, 0\\): "
                    "0@shuffle:cuda_emulation_test.cc:[0-9]+ .* 16@exited");
}

__global__ void SyncAfterSomeExit(float* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Undefined in CUDA, and a hang on some devices.
TEST(BlockEmulatorDeathTest, StopsAtASyncthreadsAfterSomeThreadsExited) {
  ExpectLaunchStops(SyncAfterSomeExit, 64, "a __syncthreads after some threads exited");
}

__global__ void SyncAtTwoPlaces(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

TEST(BlockEmulatorDeathTest, StopsWhereThreadsWaitAtDifferentBarriers) {
  ExpectLaunchStops(SyncAtTwoPlaces, 64,
                    "a barrier that not every thread reaches: .*@syncthreads:cuda_emulation_test.cc:");
}

// Each warp's first lane sums every warp's slot and then overwrites its
// own, while other warps may still read it (a missing barrier): a warp runs
// ahead to the block's barrier, as a GPU may run it, so a later warp reads
// what it wrote. Under TSan a race between warps only
// (tsan_selftest_cuda_emulation_overwrite).
__global__ void OverwriteWhatOtherWarpsRead(float* out) {
  __shared__ float slots[4];
  const unsigned t = threadIdx.x;
  if (t % 32 == 0) slots[t / 32] = 1.0f;
  __syncthreads();
  if (t % 32 != 0) return;
  float total = 0;
  for (int w = 0; w < 4; ++w) total += slots[w];
  slots[t / 32] = total;  // a __syncthreads is missing above
  out[t / 32] = total;
}

TEST(BlockEmulatorRaceTest, AWarpRunsAheadToTheBlocksBarrier) {
  std::vector<float> out(4);
  TXL_LAUNCH_KERNEL(1, 128, 0, nullptr, OverwriteWhatOtherWarpsRead)(out.data());
  EXPECT_EQ(std::count(out.begin(), out.end(), 4.0f), 1) << "only the first warp to run read four 1s";
}

__global__ void ReadStaticSharedFirst(float* out) {
  __shared__ float slot;
  out[blockIdx.x] = slot;  // before any thread writes it
  __syncthreads();
  slot = 1.0f;
}

template <int kOffset>
__global__ void ReadStaticSharedFirstInATemplate(float* out) {
  __shared__ float slot;
  out[blockIdx.x] = slot;
  __syncthreads();
  slot = 1.0f + kOffset;
}

TEST(BlockEmulatorRaceTest, StaticSharedMemoryStartsAsNaN) {
  std::vector<float> out(2, 0.0f);
  TXL_LAUNCH_KERNEL(2, 32, 0, nullptr, ReadStaticSharedFirst)(out.data());
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1])) << "the second block saw the first one's write";
#if defined(__clang__)
  // A kernel template's statics too (the split attention's): GCC 12 leaves
  // them out of the section (block_emulator.h), clang keeps them there.
  out.assign(2, 0.0f);
  TXL_LAUNCH_KERNEL(2, 32, 0, nullptr, ReadStaticSharedFirstInATemplate<1>)(out.data());
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1])) << "the second block saw the first one's write";
#endif
}

__global__ void RecordOrder(int* order, int* next) {
  if (threadIdx.x == 0) order[(*next)++] = static_cast<int>(blockIdx.x);
}

TEST(BlockEmulatorTest, ASeedShufflesTheBlocksOrder) {
  std::vector<int> order(40, -1);
  int next = 0;
  txl_emu::SetOrderSeed(11);
  TXL_LAUNCH_KERNEL(40, 32, 0, nullptr, RecordOrder)(order.data(), &next);
  EXPECT_EQ(next, 40);
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), 40u) << "every block once";
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
  next = 0;
  txl_emu::SetOrderSeed(0);
  TXL_LAUNCH_KERNEL(40, 32, 0, nullptr, RecordOrder)(order.data(), &next);
  txl_emu::SetOrderSeed(1);
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << "seed 0: in order";
}

// Each thread reads its neighbour's slot with no barrier after the writes:
// whichever of a pair runs first reads the other's slot unwritten (NaN
// bytes), in any order the seed draws. Under TSan a race too
// (tsan_selftest_cuda_emulation_race). (BlockEmulatorRaceTest: the kernels
// with races on purpose, left out of TSan's clean run.)
__global__ void ReadNeighbourWithoutBarrier(float* out) {
  __shared__ float slots[64];
  const unsigned t = threadIdx.x;
  slots[t] = static_cast<float>(t);
  out[t] = slots[t ^ 1];
}

TEST(BlockEmulatorRaceTest, ReadsANeighboursWriteWithoutABarrier) {
  std::vector<float> out(64, 0.0f);
  TXL_LAUNCH_KERNEL(1, 64, 0, nullptr, ReadNeighbourWithoutBarrier)(out.data());
  EXPECT_EQ(std::count_if(out.begin(), out.end(), [](float x) { return std::isnan(x); }), 32)
      << "one thread of each pair read its neighbour's slot before the write";
}

// ---- The kernels against their CPU forms ----

// n float32 or bfloat16 values, `skip` elements past a 16-byte boundary.
class Array {
 public:
  Array(int64_t n, bool bf16, int64_t skip = 0)
      : n_(n), bf16_(bf16), skip_(skip), raw_(new unsigned char[(n + skip) * Size() + 16]) {}
  Array(const Array& other) : Array(other.n_, other.bf16_, other.skip_) {
    std::memcpy(data(), other.data(), n_ * Size());
  }
  void* data() { return Aligned() + skip_ * Size(); }
  const void* data() const { return Aligned() + skip_ * Size(); }
  float* floats() { return static_cast<float*>(data()); }
  float Get(int64_t i) const { return LoadAsFloat(data(), bf16_, i); }
  void Set(int64_t i, float value) { StoreFromFloat(data(), bf16_, i, value); }
  bool bf16() const { return bf16_; }
  bool SameBytes(const Array& other) const { return std::memcmp(data(), other.data(), n_ * Size()) == 0; }

 private:
  int64_t Size() const { return bf16_ ? 2 : 4; }
  unsigned char* Aligned() const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw_.get());
    return raw_.get() + (16 - p % 16) % 16;
  }

  int64_t n_;
  bool bf16_;
  int64_t skip_;
  std::unique_ptr<unsigned char[]> raw_;
};

Array Random(int64_t n, bool bf16, std::mt19937* rng, int64_t skip = 0) {
  std::normal_distribution<float> normal;
  Array a(n, bf16, skip);
  for (int64_t i = 0; i < n; ++i) a.Set(i, normal(*rng));
  return a;
}

struct SplitCase {
  int64_t dh;
  bool kv_bf16, q_bf16, rel_bf16;
  std::vector<int64_t> held = {70, 200, 0, 130, 5}, window = {71, 5, 1, 800, 6};
  bool misaligned = false;
  uint64_t order_seed = 1;  // of the blocks, warps and lanes (block_emulator.h)
};

std::string Name(const SplitCase& c) {
  return "dh " + std::to_string(c.dh) + (c.kv_bf16 ? ", bf16 pools" : ", f32 pools") +
         (c.q_bf16 ? ", bf16 query" : "") + (c.rel_bf16 ? ", bf16 table" : "") + (c.misaligned ? ", misaligned" : "") +
         ", longest " + std::to_string(*std::max_element(c.held.begin(), c.held.end())) + ", order " +
         std::to_string(c.order_seed);
}

// The inputs of one decode step, as the CUDA test of model_test makes them:
// each session's keys in scattered pool rows (row 0 the zero padding row),
// its own key's row holding a stale key until the kernel stores the new one.
struct SplitInputs {
  int64_t B = 0, H = 3, dh = 0, keys = 0;
  std::vector<Array> arrays;  // pool keys, pool values, q, u, v, rel
  std::vector<int64_t> rows, own;
};

SplitInputs MakeSplitInputs(const SplitCase& c) {
  std::mt19937 rng(static_cast<unsigned>(c.dh * 131 + c.kv_bf16 * 7 + c.q_bf16 * 3 + c.rel_bf16));
  SplitInputs in;
  in.B = static_cast<int64_t>(c.held.size());
  in.dh = c.dh;
  const int64_t B = in.B, H = in.H, dh = c.dh;
  in.keys = (*std::max_element(c.held.begin(), c.held.end()) + 1 + 127) / 128 * 128;
  int64_t used = 0;
  for (const int64_t m : c.held) used += m + 1;
  const int64_t pool_rows = used + 7, skip = c.misaligned ? 1 : 0;
  in.arrays.push_back(Random(pool_rows * H * dh, c.kv_bf16, &rng, skip));
  in.arrays.push_back(Random(pool_rows * H * dh, c.kv_bf16, &rng, skip));
  for (int i = 0; i < 2; ++i)
    for (int64_t e = 0; e < H * dh; ++e) in.arrays[i].Set(e, 0.0f);  // the padding row
  in.arrays.push_back(Random(B * 3 * H * dh, c.q_bf16, &rng));
  in.arrays.push_back(Random(H * dh, false, &rng));
  in.arrays.push_back(Random(H * dh, false, &rng));
  in.arrays.push_back(Random(in.keys * H * dh, c.rel_bf16, &rng, skip));
  std::vector<int64_t> order(pool_rows - 1);
  for (int64_t i = 0; i < pool_rows - 1; ++i) order[i] = i + 1;
  std::shuffle(order.begin(), order.end(), rng);
  in.rows.assign(B * in.keys, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j <= c.held[b]; ++j) in.rows[b * in.keys + j] = order[next++];
  for (int64_t b = 0; b < B; ++b) in.own.push_back(in.rows[b * in.keys + c.held[b]]);
  return in;
}

// One run's outputs over its own copies of the inputs.
struct SplitRun {
  std::vector<Array> arrays;
  std::vector<float> partial;
  Array out;
  std::vector<int> done;
};

SplitRun RunSplit(const SplitCase& c, const SplitInputs& in, bool emulated) {
  SplitRun r{in.arrays, {}, Array(in.B * in.H * in.dh, c.q_bf16), {}};
  SplitDecodeArgs a;
  a.sessions = in.B;
  a.heads = in.H;
  a.dh = in.dh;
  a.keys = in.keys;
  a.pool_keys = r.arrays[0].data();
  a.pool_values = r.arrays[1].data();
  a.kv_bf16 = c.kv_bf16;
  a.q = r.arrays[2].data();
  a.q_stride = 3 * in.H * in.dh;
  a.q_bf16 = c.q_bf16;
  a.u = r.arrays[3].floats();
  a.v = r.arrays[4].floats();
  a.rel = r.arrays[5].data();
  a.rel_bf16 = c.rel_bf16;
  a.rel_size = in.keys;
  a.rows = in.rows.data();
  a.held = c.held.data();
  a.window = c.window.data();
  a.write_rows = in.own.data();
  a.skip_row = in.own.back();  // the last session pads: nothing is stored in its row
  a.scale = 0.156f;
  r.partial.assign(in.B * in.H * a.Chunks() * (in.dh + 2), 7.0f);  // stale values must not leak
  a.partial = r.partial.data();
  for (int64_t i = 0; i < in.B * in.H * in.dh; ++i) r.out.Set(i, 7.0f);
  a.out = r.out.data();
  a.out_stride = in.H * in.dh;
  a.out_bf16 = c.q_bf16;
  r.done.assign(in.B * in.H, 0);
  a.done = r.done.data();
  if (emulated) {
    txl_emu::SetOrderSeed(c.order_seed);
    const char* error = QueueSplitDecodeAttention(a, nullptr);
    txl_emu::SetOrderSeed(1);
    EXPECT_EQ(error, nullptr) << Name(c) << ": " << error;
  } else {
    SplitDecodeAttentionCpu(a, 0, in.B * in.H);
  }
  return r;
}

void CheckSplit(const SplitCase& c) {
  SCOPED_TRACE(Name(c));
  const SplitInputs in = MakeSplitInputs(c);
  const SplitRun want = RunSplit(c, in, false), got = RunSplit(c, in, true);
  const int64_t n = in.B * in.H * in.dh, chunks = in.keys / kSplitChunk;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want.out.Get(i), g = got.out.Get(i), diff = std::abs(g - w);
    worst = std::max(worst, diff);
    // float32: the sums' order; bfloat16: one rounding of either side.
    ASSERT_LE(diff, c.q_bf16 ? 8e-3 * std::abs(w) + 1e-6 : 2e-5 * (1 + std::abs(w)))
        << "output " << i << ": " << g << " against " << w;
  }
  // Each chunk's partial: its max and sum, and its weighted values.
  for (size_t i = 0; i < want.partial.size(); ++i) {
    const float w = want.partial[i], g = got.partial[i];
    if (std::isinf(w)) {
      ASSERT_EQ(g, w) << "partial " << i << " (a chunk with no attended key)";
    } else {
      ASSERT_LE(std::abs(g - w), 2e-5 * (1 + std::abs(w))) << "partial " << i << ": " << g << " against " << w;
    }
  }
  EXPECT_TRUE(got.arrays[0].SameBytes(want.arrays[0])) << "the stored keys";
  EXPECT_TRUE(got.arrays[1].SameBytes(want.arrays[1])) << "the stored values";
  EXPECT_FALSE(got.arrays[0].SameBytes(in.arrays[0])) << "no key was stored";
  const int64_t skip = in.own.back() * in.H * in.dh;
  for (int64_t e = 0; e < in.H * in.dh; ++e)
    ASSERT_EQ(got.arrays[0].Get(skip + e), in.arrays[0].Get(skip + e)) << "the padding session's row was written";
  EXPECT_EQ(std::count(got.done.begin(), got.done.end(), static_cast<int>(chunks)), in.B * in.H)
      << "every chunk counted itself off";
  std::printf("%s: largest difference %.3g\n", Name(c).c_str(), worst);
}

// The kernel variants (E columns a load): 16-byte loads for dh 64, 96, 48
// (whose vectors a row do not divide the block's threads) and 8 (fewer than
// four vectors a row); four bfloat16 values a load for 36 and 20; one value
// a load for 41 and 258 (over one row per thread).
// Pools, queries and tables each float32 or bfloat16, each case in an order
// of its own.
TEST(SplitDecodeAttentionKernelTest, MatchesTheCpuFormInEveryVariant) {
  uint64_t seed = 2;
  for (const int64_t dh : {64, 96, 48, 8, 36, 20, 41, 258}) {
    for (const auto& [kv, q, rel] :
         {std::tuple{false, false, false}, std::tuple{true, true, true}, std::tuple{true, false, false},
          std::tuple{false, true, true}, std::tuple{false, true, false}}) {
      SplitCase c{dh, kv, q, rel};
      c.order_seed = seed++;
      CheckSplit(c);
    }
  }
}

TEST(SplitDecodeAttentionKernelTest, MatchesTheCpuFormWithMisalignedPools) {
  SplitCase c{64, false, false, false};
  c.misaligned = true;
  CheckSplit(c);
  c.kv_bf16 = c.rel_bf16 = true;
  CheckSplit(c);
}

// A full window of 800 keys (14 chunks, 13 attended), in index order and
// in shuffled ones, so that different blocks are the last of their
// (session, head).
TEST(SplitDecodeAttentionKernelTest, MatchesTheCpuFormOverAFullWindowInAnyOrder) {
  for (const uint64_t order : {0, 5, 9}) {
    SplitCase c{64, order == 9, order == 9, order == 9};
    c.held = {70, 800, 0, 5};
    c.window = {71, 800, 1, 6};
    c.order_seed = order;
    CheckSplit(c);
  }
}

TEST(ResidualLayerNormKernelTest, MatchesTheCpuForm) {
  struct Shape {
    int64_t rows, width;
    bool add_bf16;
  };
  for (const Shape& s :
       {Shape{1, 512, false}, Shape{32, 410, true}, Shape{2, 8192, false}, Shape{3, 1, false}, Shape{4, 130, true}}) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " x " + std::to_string(s.width));
    std::mt19937 rng(static_cast<unsigned>(s.rows * 1000 + s.width));
    const int64_t n = s.rows * s.width;
    Array x = Random(n, false, &rng), add = Random(n, s.add_bf16, &rng);
    Array weight = Random(s.width, false, &rng), bias = Random(s.width, false, &rng);
    for (int64_t i = 0; i < n; ++i) x.Set(i, 3 * x.Get(i) + 1);
    Array outs[2] = {Array(n, false), Array(n, false)}, narrows[2] = {Array(n, true), Array(n, true)};
    for (const bool emulated : {false, true}) {
      ResidualNormArgs a;
      a.rows = s.rows;
      a.width = s.width;
      a.x = x.floats();
      a.add = add.data();
      a.add_bf16 = s.add_bf16;
      a.weight = weight.floats();
      a.bias = bias.floats();
      a.out = outs[emulated].floats();
      a.out_bf16 = narrows[emulated].data();
      if (emulated) {
        const char* error = QueueResidualLayerNorm(a, nullptr);
        ASSERT_EQ(error, nullptr) << error;
      } else {
        ResidualLayerNormCpu(a, 0, s.rows);
      }
    }
    double largest_weight = 0;
    for (int64_t i = 0; i < s.width; ++i) largest_weight = std::max(largest_weight, std::abs(double{weight.Get(i)}));
    const double bound = 1e-5 * (1 + largest_weight);
    for (int64_t i = 0; i < n; ++i) {
      const double w = outs[0].Get(i), g = outs[1].Get(i);
      ASSERT_LE(std::abs(g - w), bound) << "element " << i << ": " << g << " against " << w;
      ASSERT_LE(std::abs(narrows[1].Get(i) - narrows[0].Get(i)), 8e-3 * std::abs(w) + bound)
          << "element " << i << " of the bfloat16 copy";
    }
  }
}

TEST(ResidualLayerNormKernelTest, RefusesRowsWiderThanItsSharedMemory) {
  ResidualNormArgs a;
  a.rows = 1;
  a.width = kResidualNormMaxWidth + 1;
  const char* error = QueueResidualLayerNorm(a, nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(std::string(error).find("kResidualNormMaxWidth"), std::string::npos) << error;
}

struct SkinnyCase {
  int64_t rows, cols, outs;
  bool bf16;  // x, W, the bias and y bfloat16 (the generic path's bfloat16 activations)
  bool bias = true, relu = false;
  int64_t skip = 0;  // x starts this many elements past 16 bytes
  uint64_t order_seed = 1;
};

std::string Name(const SkinnyCase& c) {
  return std::to_string(c.rows) + " x " + std::to_string(c.cols) + " by " + std::to_string(c.outs) +
         (c.bf16 ? ", bf16" : ", f32") + (c.bias ? ", bias" : "") + (c.relu ? ", relu" : "") +
         (c.skip != 0 ? ", misaligned x" : "") + ", order " + std::to_string(c.order_seed);
}

// The kernel and its CPU form add in the same order, and neither fuses a
// multiply and an add (both are built with -ffp-contract=off), so their
// results are the same bits: the kernel's indexing is checked exactly.
// Outputs past the last are left as they were.
void CheckSkinny(const SkinnyCase& c) {
  SCOPED_TRACE(Name(c));
  std::mt19937 rng(static_cast<unsigned>(c.rows * 7919 + c.cols * 31 + c.outs));
  const Array x = Random(c.rows * c.cols, c.bf16, &rng, c.skip), w = Random(c.outs * c.cols, c.bf16, &rng);
  const Array bias = Random(c.outs, c.bf16, &rng);
  const int64_t n = c.rows * c.outs, guard = 40;
  Array ys[2] = {Array(n + guard, c.bf16), Array(n + guard, c.bf16)};
  for (const bool emulated : {false, true}) {
    for (int64_t i = 0; i < n + guard; ++i) ys[emulated].Set(i, 7.0f);
    SkinnyProductArgs a;
    a.rows = c.rows;
    a.cols = c.cols;
    a.outs = c.outs;
    a.x = x.data();
    a.w = w.data();
    a.bias = c.bias ? bias.data() : nullptr;
    a.x_bf16 = a.w_bf16 = a.bias_bf16 = a.y_bf16 = c.bf16;
    a.relu = c.relu;
    a.y = ys[emulated].data();
    if (emulated) {
      txl_emu::SetOrderSeed(c.order_seed);
      const char* error = QueueSkinnyProduct(a, nullptr);
      txl_emu::SetOrderSeed(1);
      ASSERT_EQ(error, nullptr) << error;
    } else {
      SkinnyProductCpu(a, 0, c.outs);
    }
  }
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = ys[0].Get(i), got = ys[1].Get(i);
    ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "output " << i << ": " << got << " against " << want;
    zeros += want == 0;
  }
  // The CPU form's own sums, against a double one (the butterfly is a sum).
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t o = 0; o < c.outs; o += 7) {
      double sum = c.bias ? bias.Get(o) : 0, size = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        sum += double{x.Get(r * c.cols + k)} * w.Get(o * c.cols + k);
        size += std::abs(double{x.Get(r * c.cols + k)} * w.Get(o * c.cols + k));
      }
      if (c.relu) sum = std::max(sum, 0.0);
      const double got = ys[0].Get(r * c.outs + o);
      ASSERT_LE(std::abs(got - sum), (c.bf16 ? 8e-3 * std::abs(sum) : 0) + 1e-6 * (1 + size))
          << "row " << r << ", output " << o;
    }
  }
  if (c.relu) {
    EXPECT_GT(zeros, n / 4) << "the ReLU zeroed about half";
  }
  for (int64_t i = n; i < n + guard; ++i) ASSERT_EQ(ys[1].Get(i), 7.0f) << "past the last output: " << i;
}

// Every variant: 16-byte vectors of weights (cols 512, 2048, 4096, 40 and
// 36 float32, four a vector; 512, 2048, 4096 and 40 bfloat16, eight a
// vector) and one value a load (41 and 301; 36 in bfloat16; misaligned x);
// a lane's eight loads in flight once (512) or in several rounds (2048 and
// 4096 in float32, 4096 in bfloat16, 301); rows 1 to 8 (the kernel's R of
// 1, 2, 4 and 8, some rows unused), and 9 to 32 in groups of eight (the
// grid's y: two groups, the last of one row; two whole; three, the last of
// one; four whole; with 16-byte loads and one value a load); outputs fewer than a block's warps, and not a multiple
// of them. Each case in an order of its own.
TEST(SkinnyProductKernelTest, MatchesTheCpuFormInEveryVariant) {
  uint64_t seed = 3;
  for (const bool bf16 : {false, true}) {
    for (const SkinnyCase& shape :
         {SkinnyCase{1, 512, 13, bf16}, SkinnyCase{2, 2048, 6, bf16}, SkinnyCase{3, 512, 9, bf16, false},
          SkinnyCase{8, 40, 5, bf16, true, true}, SkinnyCase{5, 41, 3, bf16}, SkinnyCase{7, 36, 2, bf16, true, true},
          SkinnyCase{4, 64, 11, bf16, true, false, 1}, SkinnyCase{1, 8, 1, bf16}, SkinnyCase{2, 4096, 3, bf16},
          SkinnyCase{1, 301, 5, bf16}, SkinnyCase{9, 512, 6, bf16}, SkinnyCase{16, 40, 5, bf16, true, true},
          SkinnyCase{17, 301, 3, bf16}, SkinnyCase{17, 64, 6, bf16, true, true}, SkinnyCase{32, 512, 5, bf16, false},
          SkinnyCase{32, 2048, 5, bf16, true, true, 1}}) {
      SkinnyCase c = shape;
      c.order_seed = seed++;
      CheckSkinny(c);
    }
  }
}

TEST(SkinnyProductKernelTest, RefusesMoreRowsThanItTakes) {
  SkinnyProductArgs a;
  a.rows = kSkinnyMaxRows + 1;
  a.cols = a.outs = 4;
  const char* error = QueueSkinnyProduct(a, nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(std::string(error).find("kSkinnyMaxRows"), std::string::npos) << error;
}

}  // namespace
}  // namespace txl
