// SplitDecodeAttention's CUDA kernels (split_decode_attention.h). One block
// per (chunk, head, session), one thread per key of the chunk; then one block
// per (head, session) combines the chunks. The per-key arithmetic and the
// combination are model/kernels/split_decode_attention.h's, shared with the
// CPU's run that the tests check.
#include "model/cuda/split_decode_attention.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace txl {
namespace {

constexpr int kWarps = kSplitChunk / 32;
static_assert(kSplitChunk % 32 == 0, "a chunk is whole warps");

__device__ float WarpMax(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ float WarpSum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// SplitDecodeScore with 16-byte loads (8 for bfloat16), where dh is a
// multiple of 4 and the pool and table start 16-byte aligned: a thread
// reads its key's row in a quarter of the loads.
__device__ float Score4(const SplitDecodeArgs& a, const float* qu, const float* qv, int64_t b, int64_t h, int64_t j) {
  const int64_t row = a.rows[b * a.keys + j];
  int64_t dist = a.held[b] - j;
  if (dist > a.rel_size - 1) dist = a.rel_size - 1;
  const int64_t quads = a.dh / 4, k0 = (row * a.heads + h) * a.dh;
  const float4* qu4 = reinterpret_cast<const float4*>(qu);
  const float4* qv4 = reinterpret_cast<const float4*>(qv);
  const float4* r4 = reinterpret_cast<const float4*>(a.rel + (dist * a.heads + h) * a.dh);
  float ac = 0, bd = 0;
#pragma unroll 4
  for (int64_t i = 0; i < quads; ++i) {
    float4 k;
    if (a.kv_bf16) {
      const uint2 w = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(a.pool_keys) + k0)[i];
      k = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                      __uint_as_float(w.y & 0xffff0000u));
    } else {
      k = reinterpret_cast<const float4*>(static_cast<const float*>(a.pool_keys) + k0)[i];
    }
    const float4 q = qu4[i], p = qv4[i], r = r4[i];
    ac += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
    bd += p.x * r.x + p.y * r.y + p.z * r.z + p.w * r.w;
  }
  return (ac + bd) * a.scale;
}

// Block (chunk c, head h, session b): thread t scores key c * kSplitChunk + t,
// then threads take the value columns d and sum the chunk's weighted values.
// The sum reads every key's row without a branch (a key that is not attended
// has weight 0 and reads its row, or the pool's zero padding row past the
// keys), so that the unrolled loads are in flight together.
template <bool kQuads>
__global__ void __launch_bounds__(kSplitChunk) ChunkPartials(SplitDecodeArgs a) {
  const int64_t c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int t = threadIdx.x;
  extern __shared__ float4 q_shared4[];  // qu [dh], then qv [dh]: 16-byte aligned
  float* q_shared = reinterpret_cast<float*>(q_shared4);
  __shared__ float weight[kSplitChunk];
  __shared__ int64_t value_at[kSplitChunk];  // the offset of each key's head-h values in the pool
  __shared__ float reduce[kWarps];
  float* qu = q_shared;
  float* qv = q_shared + a.dh;
  const float* q = a.q + b * a.q_stride + h * a.dh;
  for (int64_t d = t; d < a.dh; d += kSplitChunk) {
    qu[d] = q[d] + a.u[h * a.dh + d];
    qv[d] = q[d] + a.v[h * a.dh + d];
  }
  __syncthreads();
  const int64_t j = c * kSplitChunk + t;
  value_at[t] = ((j < a.keys ? a.rows[b * a.keys + j] : 0) * a.heads + h) * a.dh;
  float score = -INFINITY;
  if (SplitDecodeAttends(a, b, j)) score = kQuads ? Score4(a, qu, qv, b, h, j) : SplitDecodeScore(a, qu, qv, b, h, j);

  float top = WarpMax(score);
  if (t % 32 == 0) reduce[t / 32] = top;
  __syncthreads();
  top = reduce[0];
  for (int w = 1; w < kWarps; ++w) top = fmaxf(top, reduce[w]);
  __syncthreads();  // every thread has read `reduce` before it is reused

  const float w = score == -INFINITY ? 0.0f : expf(score - top);
  weight[t] = w;
  const float warp_sum = WarpSum(w);
  if (t % 32 == 0) reduce[t / 32] = warp_sum;
  __syncthreads();
  float* out = a.Partial(b, h, c);
  if (t == 0) {
    float sum = 0;
    for (int i = 0; i < kWarps; ++i) sum += reduce[i];
    out[0] = top;
    out[1] = sum;
  }
  for (int64_t d = t; d < a.dh; d += kSplitChunk) {
    float value = 0;
#pragma unroll 8
    for (int i = 0; i < kSplitChunk; ++i) value += weight[i] * SplitDecodeKv(a.pool_values, a.kv_bf16, value_at[i] + d);
    out[2 + d] = value;
  }
}

// Block (head h, session b): thread d's output column from every chunk.
__global__ void CombineChunks(SplitDecodeArgs a) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
  for (int64_t d = threadIdx.x; d < a.dh; d += blockDim.x)
    a.out[b * a.out_stride + h * a.dh + d] = SplitDecodeCombine(a, b, h, d);
}

}  // namespace

const char* LaunchSplitDecodeAttention(const SplitDecodeArgs& a, void* stream) {
  if (a.sessions == 0) return nullptr;
  if (a.heads > 65535 || a.sessions > 65535) return "SplitDecodeAttention: over 65535 heads or sessions";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 chunks(static_cast<unsigned>(a.Chunks()), static_cast<unsigned>(a.heads),
                    static_cast<unsigned>(a.sessions));
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const size_t shared = 2 * ((a.dh + 3) / 4) * sizeof(float4);
  if (a.dh % 4 == 0 && aligned(a.pool_keys) && aligned(a.rel)) {
    ChunkPartials<true><<<chunks, kSplitChunk, shared, s>>>(a);
  } else {
    ChunkPartials<false><<<chunks, kSplitChunk, shared, s>>>(a);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const int threads = a.dh < 32 ? 32 : (a.dh > 256 ? 256 : static_cast<int>((a.dh + 31) / 32 * 32));
  CombineChunks<<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sessions)), threads, 0, s>>>(a);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace txl
