// One decode step's attention, fused and split over chunks of keys: every
// session feeds one query, and its keys and values are read in place from
// the generic path's slot pool (model/net/slot_pool.h) through the rows its
// pass gathers. Per (session, head, chunk of kSplitChunk keys) a partial
// softmax (its max, its sum and its weighted values), then per (session,
// head) the partials combined. This replaces the gather of every session's
// keys into a padded block, the position term's product and gather, the
// mask, the softmax and the two attention products of the tensor-op path.
//
// The CPU's run of these steps (split_decode_attention.cc) is what
// `--kernels generic` takes; the CUDA kernel (model/cuda/
// split_decode_attention.cu, CUDA build only) shares the mask
// (SplitDecodeAttends), the bfloat16 widening (host_device.h) and the
// layout of the partials, and repeats the score's indexing and the value
// sums with 16-byte loads, and the combination with parallel loads, in the
// last of a (session, head)'s blocks to finish (`done`). So the tests here
// check the algorithm and its CPU form; the kernel's source runs on the CPU
// on a block emulator (tests/model/cuda/), and on a lent GPU
// (scripts/gpu_check.sh: unit, eval, graphs and servers against the CPU).
// Torch-free, and free of CUDA headers.
#ifndef TXL_MODEL_KERNELS_SPLIT_DECODE_ATTENTION_H_
#define TXL_MODEL_KERNELS_SPLIT_DECODE_ATTENTION_H_

#include <math.h>

#include <cstdint>

#include "model/kernels/host_device.h"

namespace txl {

// Keys per chunk: one CUDA thread each.
constexpr int kSplitChunk = 64;

struct SplitDecodeArgs {
  int64_t sessions = 0, heads = 0, dh = 0;
  int64_t keys = 0;  // padded keys per session: rows holds sessions * keys entries
  // Session b's query for head h at element b * q_stride + h * dh of q,
  // float32 or bfloat16 (q_bf16).
  const void* q = nullptr;
  int64_t q_stride = 0;
  bool q_bf16 = false;
  const float* u = nullptr;  // [heads, dh]: the content bias
  const float* v = nullptr;  // [heads, dh]: the position bias
  // The pool's keys and values, rows of [heads, dh], float32 or bfloat16.
  void* pool_keys = nullptr;
  void* pool_values = nullptr;
  bool kv_bf16 = false;
  const int64_t* rows = nullptr;  // [sessions * keys]: key j of session b is pool row rows[b * keys + j]
  // Where the query's own key and value go: session b's (elements
  // b * q_stride + heads * dh and + 2 * heads * dh of q, the rest of its
  // [3, heads, dh] projection) are stored to pool row write_rows[b], in the
  // pool's type, before any key is read, so that no copy into the pool
  // precedes the attention. Row rows[b * keys + held[b]] is that row for a
  // session; no other key of the session reads it. A padding session's
  // write row is skip_row (the pool's discard row), and nothing is stored
  // there (its padding row is what it reads). Null: the caller has written
  // them.
  const int64_t* write_rows = nullptr;
  int64_t skip_row = -1;
  const int64_t* held = nullptr;    // m_b: keys before the query, which is key m_b itself
  const int64_t* window = nullptr;  // M_b: the session's mem_len
  // [rel_size, heads, dh]: the position key at distance d, float32 or
  // bfloat16 (rel_bf16: where reduced weights round the table to bfloat16
  // anyway, half the bytes for the same values).
  const void* rel = nullptr;
  bool rel_bf16 = false;
  int64_t rel_size = 0;
  float scale = 1;
  float* partial = nullptr;  // [sessions, heads, Chunks(), dh + 2]: max, sum, weighted values
  // CUDA only: [sessions * heads] counters, zero before the call, that each
  // (session, head)'s chunk blocks count themselves off on, so that the
  // last to finish combines the partials (no second kernel). The CPU form
  // does not read them.
  int* done = nullptr;
  // Session b's head h at element b * out_stride + h * dh of out, float32
  // or bfloat16 (out_bf16: rounded to nearest even, as torch converts).
  void* out = nullptr;
  int64_t out_stride = 0;
  bool out_bf16 = false;

  TXL_HOST_DEVICE int64_t Chunks() const { return (keys + kSplitChunk - 1) / kSplitChunk; }
  TXL_HOST_DEVICE float* Partial(int64_t b, int64_t h, int64_t chunk) const {
    return partial + ((b * heads + h) * Chunks() + chunk) * (dh + 2);
  }
};

// Stores element d of (session b, head h)'s own key and value to its write
// row (write_rows), rounded as torch converts where the pool is bfloat16.
TXL_HOST_DEVICE inline void SplitDecodeWriteOwn(const SplitDecodeArgs& a, int64_t b, int64_t h, int64_t d) {
  if (a.write_rows[b] == a.skip_row) return;
  const int64_t from = b * a.q_stride + h * a.dh + d, to = (a.write_rows[b] * a.heads + h) * a.dh + d;
  StoreFromFloat(a.pool_keys, a.kv_bf16, to, LoadAsFloat(a.q, a.q_bf16, from + a.heads * a.dh));
  StoreFromFloat(a.pool_values, a.kv_bf16, to, LoadAsFloat(a.q, a.q_bf16, from + 2 * a.heads * a.dh));
}

// Whether session b's query attends its key j: the keys up to the query's
// own (j <= m_b), within its window (m_b - j < M_b).
TXL_HOST_DEVICE inline bool SplitDecodeAttends(const SplitDecodeArgs& a, int64_t b, int64_t j) {
  const int64_t m = a.held[b];
  return j < a.keys && j <= m && m - j < a.window[b];
}

// The score of an attended key: ((q + u) . k_j + (q + v) . r_{m_b - j}) * scale,
// with qu = q + u and qv = q + v of head h (dh each).
TXL_HOST_DEVICE inline float SplitDecodeScore(const SplitDecodeArgs& a, const float* qu, const float* qv, int64_t b,
                                              int64_t h, int64_t j) {
  const int64_t row = a.rows[b * a.keys + j];
  int64_t dist = a.held[b] - j;
  if (dist > a.rel_size - 1) dist = a.rel_size - 1;
  const int64_t k0 = (row * a.heads + h) * a.dh;
  const int64_t r0 = (dist * a.heads + h) * a.dh;
  float ac = 0, bd = 0;
  for (int64_t d = 0; d < a.dh; ++d) {
    ac += qu[d] * LoadAsFloat(a.pool_keys, a.kv_bf16, k0 + d);
    bd += qv[d] * LoadAsFloat(a.rel, a.rel_bf16, r0 + d);
  }
  return (ac + bd) * a.scale;
}

// Value d of key j's row for head h.
TXL_HOST_DEVICE inline float SplitDecodeValue(const SplitDecodeArgs& a, int64_t b, int64_t h, int64_t j, int64_t d) {
  const int64_t row = a.rows[b * a.keys + j];
  return LoadAsFloat(a.pool_values, a.kv_bf16, (row * a.heads + h) * a.dh + d);
}

// Element d of (session b, head h)'s output from its chunks' partials, in
// one pass: each chunk's sum and values rescaled to the largest max so far.
// A chunk with no attended key has max -inf and adds nothing; the query's
// own key is always attended, so some chunk has one.
TXL_HOST_DEVICE inline float SplitDecodeCombine(const SplitDecodeArgs& a, int64_t b, int64_t h, int64_t d) {
  const int64_t chunks = a.Chunks();
  float top = -INFINITY, sum = 0, value = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = a.Partial(b, h, c);
    const float m = p[0];
    if (m == -INFINITY) continue;
    if (m > top) {
      const float shrink = expf(top - m);  // 0 for the first attended chunk
      sum = sum * shrink + p[1];
      value = value * shrink + p[2 + d];
      top = m;
    } else {
      const float w = expf(m - top);
      sum += p[1] * w;
      value += p[2 + d] * w;
    }
  }
  return value / sum;
}

// The CPU's run of the steps above (split_decode_attention.cc), for the
// (session, head) items [begin, end), b * heads + h: the item's own key and
// value stored (write_rows), every chunk's partial, then the combination, as
// the CUDA kernel does.
void SplitDecodeAttentionCpu(const SplitDecodeArgs& a, int64_t begin, int64_t end);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_SPLIT_DECODE_ATTENTION_H_
