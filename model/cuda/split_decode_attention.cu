// SplitDecodeAttention's CUDA kernels (split_decode_attention.h). One block
// per (chunk, head, session), four threads per key of the chunk; then one
// block per (head, session) combines the chunks. The per-key arithmetic and the
// combination are model/kernels/split_decode_attention.h's, shared with the
// CPU's run that the tests check.
#include "model/cuda/split_decode_attention.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace txl {
namespace {

// Four threads score each key (a quarter of its columns each) and sum a
// quarter of the chunk's keys for the values, so that each thread waits on
// a quarter of the loads: one session's step has few blocks, and its time
// is the chain of a thread's memory round trips, not bandwidth.
constexpr int kLanes = 4;
constexpr int kThreads = kSplitChunk * kLanes;
constexpr int kWarps = kThreads / 32;
constexpr int kCombineThreads = 64;
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
// SplitDecodeScore's sums before the lanes add up: columns lane, lane + 4,
// ..., or with kQuads (dh a multiple of 4, pool and table 16-byte aligned)
// groups of four columns, lane, lane + 4, ..., read as one 16-byte load (8
// for bfloat16).
template <bool kQuads>
__device__ void LaneProducts(const SplitDecodeArgs& a, const float* qu, const float* qv, int64_t b, int64_t h,
                             int64_t j, int lane, float* ac, float* bd) {
  const int64_t row = a.rows[b * a.keys + j];
  int64_t dist = a.held[b] - j;
  if (dist > a.rel_size - 1) dist = a.rel_size - 1;
  const int64_t k0 = (row * a.heads + h) * a.dh;
  const float* r = a.rel + (dist * a.heads + h) * a.dh;
  if (!kQuads) {
    for (int64_t d = lane; d < a.dh; d += kLanes) {
      *ac += qu[d] * LoadAsFloat(a.pool_keys, a.kv_bf16, k0 + d);
      *bd += qv[d] * r[d];
    }
    return;
  }
  const float4* qu4 = reinterpret_cast<const float4*>(qu);
  const float4* qv4 = reinterpret_cast<const float4*>(qv);
  const float4* r4 = reinterpret_cast<const float4*>(r);
#pragma unroll 4
  for (int64_t i = lane; i < a.dh / 4; i += kLanes) {
    float4 k;
    if (a.kv_bf16) {
      const uint2 w = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(a.pool_keys) + k0)[i];
      k = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                      __uint_as_float(w.y & 0xffff0000u));
    } else {
      k = reinterpret_cast<const float4*>(static_cast<const float*>(a.pool_keys) + k0)[i];
    }
    const float4 q = qu4[i], p = qv4[i], rr = r4[i];
    *ac += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
    *bd += p.x * rr.x + p.y * rr.y + p.z * rr.z + p.w * rr.w;
  }
}

// Block (chunk c, head h, session b), kThreads threads: threads 4i..4i+3
// score key c * kSplitChunk + i; then thread group g (of kSplitChunk
// threads) sums keys g, g + 4, ... of the chunk's weighted values, column by
// column, and the groups' sums are added. Every key's row is read without a
// branch (a key that is not attended has weight 0 and reads its row, or the
// pool's zero padding row past the keys), so that unrolled loads are in
// flight together.
template <bool kQuads>
__global__ void __launch_bounds__(kThreads) ChunkPartials(SplitDecodeArgs a) {
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int t = threadIdx.x;
  const int64_t dh4 = (a.dh + 3) / 4 * 4;
  extern __shared__ float4 shared4[];  // qu [dh4], qv [dh4] (16-byte aligned), the groups' sums [kLanes][dh]
  float* qu = reinterpret_cast<float*>(shared4);
  float* qv = qu + dh4;
  float* sums = qv + dh4;
  __shared__ float weight[kSplitChunk];
  __shared__ int64_t value_at[kSplitChunk];  // the offset of each key's head-h values in the pool
  __shared__ float reduce[kWarps];
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
  if (attends) LaneProducts<kQuads>(a, qu, qv, b, h, j, lane, &ac, &bd);
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
  const int group = t / kSplitChunk, column = t % kSplitChunk;
  for (int64_t d = column; d < a.dh; d += kSplitChunk) {
    float value = 0;
#pragma unroll 8
    for (int i = group; i < kSplitChunk; i += kLanes)
      value += weight[i] * LoadAsFloat(a.pool_values, a.kv_bf16, value_at[i] + d);
    sums[group * a.dh + d] = value;
  }
  __syncthreads();
  for (int64_t d = t; d < a.dh; d += kThreads) {
    float value = 0;
    for (int g = 0; g < kLanes; ++g) value += sums[g * a.dh + d];
    out[2 + d] = value;
  }
}

// Block (head h, session b), kCombineThreads threads: SplitDecodeCombine's
// result with the chunks' loads in parallel. First the largest max and each
// chunk's scale exp(max_c - top) (0 for a chunk with no attended key), then
// the scaled sums, then each column's scaled values.
__global__ void __launch_bounds__(kCombineThreads) CombineChunks(SplitDecodeArgs a) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int t = threadIdx.x;
  const int64_t chunks = a.Chunks();
  extern __shared__ float scale[];  // [chunks]
  __shared__ float reduce[kCombineThreads / 32];
  float top = -INFINITY;
  for (int64_t c = t; c < chunks; c += kCombineThreads) top = fmaxf(top, a.Partial(b, h, c)[0]);
  top = WarpMax(top);
  if (t % 32 == 0) reduce[t / 32] = top;
  __syncthreads();
  top = reduce[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) top = fmaxf(top, reduce[w]);
  __syncthreads();
  float sum = 0;
  for (int64_t c = t; c < chunks; c += kCombineThreads) {
    const float* p = a.Partial(b, h, c);
    scale[c] = p[0] == -INFINITY ? 0.0f : expf(p[0] - top);
    sum += p[1] * scale[c];
  }
  sum = WarpSum(sum);
  if (t % 32 == 0) reduce[t / 32] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < kCombineThreads / 32; ++w) sum += reduce[w];
  for (int64_t d = t; d < a.dh; d += kCombineThreads) {
    float value = 0;
#pragma unroll 4
    for (int64_t c = 0; c < chunks; ++c) value += a.Partial(b, h, c)[2 + d] * scale[c];
    StoreFromFloat(a.out, a.out_bf16, b * a.out_stride + h * a.dh + d, value / sum);
  }
}

}  // namespace

const char* QueueSplitDecodeAttention(const SplitDecodeArgs& a, void* stream) {
  if (a.sessions == 0) return nullptr;
  if (a.heads > 65535 || a.sessions > 65535) return "SplitDecodeAttention: over 65535 heads or sessions";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 chunks(static_cast<unsigned>(a.Chunks()), static_cast<unsigned>(a.heads),
                    static_cast<unsigned>(a.sessions));
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const size_t shared = (2 * ((a.dh + 3) / 4 * 4) + kLanes * a.dh) * sizeof(float);
  if (a.dh % 4 == 0 && aligned(a.pool_keys) && aligned(a.rel)) {
    ChunkPartials<true><<<chunks, kThreads, shared, s>>>(a);
  } else {
    ChunkPartials<false><<<chunks, kThreads, shared, s>>>(a);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cudaGetErrorString(e);
  CombineChunks<<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sessions)), kCombineThreads,
                  a.Chunks() * sizeof(float), s>>>(a);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace txl
