// SplitDecodeAttention's CUDA kernel (split_decode_attention.h). One block
// per (chunk, head, session): four threads score each key of the chunk, the
// block sums the chunk's weighted values a 16-byte vector per thread, and
// the last of a (session, head)'s blocks to finish combines its chunks. The
// per-key arithmetic and the combination are model/kernels/
// split_decode_attention.h's, shared with the CPU's run that the tests check.
#include "model/cuda/split_decode_attention.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/kernel_syntax.h"
#include "model/cuda/vector_load.h"

namespace txl {
namespace {

// Four threads score each key (a quarter of its columns each), so that each
// thread waits on a quarter of the loads: one session's step has few
// blocks, and its time is the chain of a thread's memory round trips.
constexpr int kLanes = 4;
constexpr int kThreads = kSplitChunk * kLanes;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && 32 % kLanes == 0, "a key's lanes are in one warp");

__device__ float WarpMax(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ float WarpSum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// This lane's share of key j's content (ac) and position (bd) products,
// SplitDecodeScore's sums before the lanes add up: the columns of vectors
// lane, lane + 4, ... of E columns each.
template <int E, bool kKvBf16>
__device__ void LaneProducts(const SplitDecodeArgs& a, const float* qu, const float* qv, int64_t b, int64_t h,
                             int64_t j, int lane, float* ac, float* bd) {
  const int64_t row = a.rows[b * a.keys + j];
  int64_t dist = a.held[b] - j;
  if (dist > a.rel_size - 1) dist = a.rel_size - 1;
  const int64_t k0 = (row * a.heads + h) * a.dh, r0 = (dist * a.heads + h) * a.dh;
#pragma unroll 4
  for (int64_t i = lane * E; i < a.dh; i += kLanes * E) {
    float k[E], r[E];
    LoadVector<E>(a.pool_keys, kKvBf16, k0 + i, k);
    LoadVector<E>(a.rel, a.rel_bf16, r0 + i, r);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      *ac += qu[i + e] * k[e];
      *bd += qv[i + e] * r[e];
    }
  }
}

// SplitDecodeCombine's result for (session b, head h), by a whole block:
// the largest max and each chunk's scale exp(max_c - top) (0 for a chunk
// with no attended key), the scaled sums, then each column's scaled values.
// The partials were written by other blocks: read from L2 (__ldcg), past
// the caller's fence.
__device__ void CombineChunks(const SplitDecodeArgs& a, int64_t b, int64_t h, float* scale, float* reduce) {
  const int t = threadIdx.x;
  const int64_t chunks = a.Chunks();
  float top = -INFINITY;
  for (int64_t c = t; c < chunks; c += kThreads) top = fmaxf(top, __ldcg(a.Partial(b, h, c)));
  top = WarpMax(top);
  if (t % 32 == 0) reduce[t / 32] = top;
  __syncthreads();
  top = reduce[0];
  for (int w = 1; w < kWarps; ++w) top = fmaxf(top, reduce[w]);
  __syncthreads();  // every thread has read `reduce` before it is reused
  float sum = 0;
  for (int64_t c = t; c < chunks; c += kThreads) {
    const float* p = a.Partial(b, h, c);
    const float m = __ldcg(p);
    scale[c] = m == -INFINITY ? 0.0f : expf(m - top);
    sum += __ldcg(p + 1) * scale[c];
  }
  sum = WarpSum(sum);
  if (t % 32 == 0) reduce[t / 32] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < kWarps; ++w) sum += reduce[w];
  for (int64_t d = t; d < a.dh; d += kThreads) {
    float value = 0;
#pragma unroll 4
    for (int64_t c = 0; c < chunks; ++c) value += __ldcg(a.Partial(b, h, c) + 2 + d) * scale[c];
    StoreFromFloat(a.out, a.out_bf16, b * a.out_stride + h * a.dh + d, value / sum);
  }
}

// The rows of the chunk a block sums its values over at once (slots), each
// by dh / E threads: one vector of E columns each. A thread has at most
// one (row, vector) pair where dh / E <= kThreads, else the block takes one
// row at a time; never more slots than the chunk has keys.
__host__ __device__ constexpr int64_t ValueSlots(int64_t vectors) {
  return vectors >= kThreads ? 1 : (kThreads / vectors < kSplitChunk ? kThreads / vectors : kSplitChunk);
}

// Block (chunk c, head h, session b), kThreads threads: threads 4i..4i+3
// score key c * kSplitChunk + i; then the block sums the chunk's weighted
// values, ValueSlots rows at a time, each thread E columns of a row; the
// slots' sums are added; and the block that finishes its (b, h) last
// combines the chunks. Every key's row is read without a branch (a key that
// is not attended has weight 0 and reads its row, or the pool's zero padding
// row past the keys), so that unrolled loads are in flight together.
template <int E, bool kKvBf16>
__global__ void __launch_bounds__(kThreads) ChunkPartials(SplitDecodeArgs a) {
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int t = threadIdx.x;
  const int64_t dh4 = (a.dh + 3) / 4 * 4;
  const int64_t vectors = a.dh / E, slots = ValueSlots(vectors);
  // qu [dh4], qv [dh4] (16-byte aligned), the slots' sums [slots][dh], the
  // combination's chunk scales [Chunks()].
  TXL_DYNAMIC_SHARED(float4, shared4);
  float* qu = reinterpret_cast<float*>(shared4);
  float* qv = qu + dh4;
  float* sums = qv + dh4;
  float* scale = sums + slots * a.dh;
  __shared__ float weight[kSplitChunk];
  __shared__ int64_t value_at[kSplitChunk];  // the offset of each key's head-h values in the pool
  __shared__ float reduce[kWarps];
  __shared__ bool last;
  const int64_t q0 = b * a.q_stride + h * a.dh;
  for (int64_t d = t; d < a.dh; d += kThreads) {
    const float q = LoadAsFloat(a.q, a.q_bf16, q0 + d);
    qu[d] = q + a.u[h * a.dh + d];
    qv[d] = q + a.v[h * a.dh + d];
  }
  // The block whose chunk holds the query's own key stores it (head h's
  // columns of the row) before its keys are read: the __syncthreads below
  // makes the stores visible to the block, and no other block reads them.
  if (a.write_rows != nullptr && c == a.held[b] / kSplitChunk) {
    for (int64_t d = t; d < a.dh; d += kThreads) SplitDecodeWriteOwn(a, b, h, d);
  }
  const int key = t / kLanes, lane = t % kLanes;
  const int64_t j = c * kSplitChunk + key;
  if (lane == 0) value_at[key] = ((j < a.keys ? a.rows[b * a.keys + j] : 0) * a.heads + h) * a.dh;
  __syncthreads();

  const bool attends = SplitDecodeAttends(a, b, j);
  float ac = 0, bd = 0;
  if (attends) LaneProducts<E, kKvBf16>(a, qu, qv, b, h, j, lane, &ac, &bd);
  for (int off = 1; off < kLanes; off <<= 1) {  // the key's lanes are adjacent in one warp
    ac += __shfl_xor_sync(0xffffffffu, ac, off);
    bd += __shfl_xor_sync(0xffffffffu, bd, off);
  }
  const float score = attends ? (ac + bd) * a.scale : -INFINITY;

  float top = WarpMax(score);
  if (t % 32 == 0) reduce[t / 32] = top;
  __syncthreads();
  top = reduce[0];
  for (int w = 1; w < kWarps; ++w) top = fmaxf(top, reduce[w]);
  __syncthreads();  // every thread has read `reduce` before it is reused

  const float w = attends ? expf(score - top) : 0.0f;
  if (lane == 0) weight[key] = w;
  const float warp_sum = WarpSum(lane == 0 ? w : 0.0f);
  if (t % 32 == 0) reduce[t / 32] = warp_sum;
  __syncthreads();
  float* out = a.Partial(b, h, c);
  if (t == 0) {
    float sum = 0;
    for (int i = 0; i < kWarps; ++i) sum += reduce[i];
    out[0] = top;
    out[1] = sum;
  }
  for (int64_t p = t; p < slots * vectors; p += kThreads) {
    const int64_t slot = p / vectors, column = p % vectors * E;
    float value[E] = {};
#pragma unroll 4
    for (int64_t i = slot; i < kSplitChunk; i += slots) {
      float row[E];
      LoadVector<E>(a.pool_values, kKvBf16, value_at[i] + column, row);
      const float wi = weight[i];
#pragma unroll
      for (int e = 0; e < E; ++e) value[e] += wi * row[e];
    }
    float* to = sums + slot * a.dh + column;
    if (E % 4 == 0) {  // 16-byte aligned (dh and column are multiples of 4): one store per four
#pragma unroll
      for (int e = 0; e < E; e += 4)
        *reinterpret_cast<float4*>(to + e) = make_float4(value[e], value[e + 1], value[e + 2], value[e + 3]);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) to[e] = value[e];
    }
  }
  __syncthreads();
  for (int64_t d = t; d < a.dh; d += kThreads) {
    float value = 0;
    for (int64_t s = 0; s < slots; ++s) value += sums[s * a.dh + d];
    out[2 + d] = value;
  }

  // Count this block off; the last of (b, h)'s blocks combines. Each thread
  // fences its own writes to the partial before the count, and the last
  // block fences before it reads the others'.
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(a.done + b * a.heads + h, 1) == a.Chunks() - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  CombineChunks(a, b, h, scale, reduce);
}

template <int E, bool kKvBf16>
cudaError_t Queue(const SplitDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.Chunks()), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(a.sessions));
  const int64_t floats = 2 * ((a.dh + 3) / 4 * 4) + ValueSlots(a.dh / E) * a.dh + a.Chunks();
  TXL_LAUNCH_KERNEL(grid, kThreads, floats * sizeof(float), stream, ChunkPartials<E, kKvBf16>)(a);
  return cudaGetLastError();
}

}  // namespace

const char* QueueSplitDecodeAttention(const SplitDecodeArgs& a, void* stream) {
  if (a.sessions == 0) return nullptr;
  if (a.heads > 65535 || a.sessions > 65535) return "SplitDecodeAttention: over 65535 heads or sessions";
  if (a.done == nullptr) return "SplitDecodeAttention: no counters (done) for the chunks' combination";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Wide loads, E columns each (eight bfloat16 values of the pool, or four
  // float32 or bfloat16 ones), where the arrays start on 16 bytes and E
  // divides dh, so that every vector a thread reads is aligned to its size.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool wide = aligned(a.pool_keys) && aligned(a.pool_values) && aligned(a.rel);
  cudaError_t e;
  if (a.kv_bf16) {
    e = wide && a.dh % 8 == 0   ? Queue<8, true>(a, s)
        : wide && a.dh % 4 == 0 ? Queue<4, true>(a, s)
                                : Queue<1, true>(a, s);
  } else {
    e = wide && a.dh % 4 == 0 ? Queue<4, false>(a, s) : Queue<1, false>(a, s);
  }
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace txl
