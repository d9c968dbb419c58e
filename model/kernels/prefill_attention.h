// One session's attention in a prefill pass through one layer, fused, on AMX
// tiles: for each head and block of 16 queries, the content scores
// (q + u) . k_j and the position scores (q + v) . r_d over just the keys of
// the block's windows, the softmax, and the sum of values, without the
// pass-wide score tensors of the tensor-op path. For bfloat16 passes (the
// operands rounded to bfloat16 as the tensor-op path rounds them; scores,
// softmax and sums stay float32). Torch-free; the caller runs Pack and Run
// over threads.
#ifndef TXL_MODEL_KERNELS_PREFILL_ATTENTION_H_
#define TXL_MODEL_KERNELS_PREFILL_ATTENTION_H_

#include <cstdint>
#include <vector>

namespace txl {

struct PrefillAttentionArgs {
  int64_t heads = 0, dh = 0;
  int64_t n = 0;             // queries: the session's new positions in this pass
  int64_t held = 0;          // m: keys before the first query
  int64_t window = 0;        // M: mem_len; query i sees keys max(0, m + i - M + 1) .. m + i
  const float* q = nullptr;  // [n, q_stride]: head h at column h * dh
  int64_t q_stride = 0;
  const float* u = nullptr;     // [heads, dh]: content bias (r_w_bias)
  const float* v = nullptr;     // [heads, dh]: position bias (r_r_bias)
  const float* keys = nullptr;  // [m + n, kv_stride]: head h at column h * dh
  const float* values = nullptr;
  int64_t kv_stride = 0;
  const float* rel = nullptr;  // [rel_size, heads, dh]: W_r R at distance d in row d
  int64_t rel_size = 0;        // at least min(m + n, M)
  float scale = 0;
  float* out = nullptr;  // [n, out_stride]: head h at column h * dh
  int64_t out_stride = 0;
};

// AMX is usable and the head size is one the kernel handles (32 or 64).
bool PrefillAttentionRuns(int64_t dh);

// The packed operands, kept by the caller from pass to pass: buffers of a
// few MB allocated per layer would be fresh pages (faults, zeroing) each time.
struct PrefillAttentionBuffers {
  std::vector<uint16_t> qu, qv;  // [heads, rows, dh]
  std::vector<uint16_t> k;       // [heads, dh / 2, keys, 2]
  std::vector<uint16_t> v;       // [heads, keys / 2, dh, 2]
  std::vector<uint16_t> r;       // [heads, dh / 2, table, 2]: distance table - 65 - e in column e
};

class PrefillAttention {
 public:
  PrefillAttention(const PrefillAttentionArgs& args, PrefillAttentionBuffers* buffers);
  // Rounds and lays out the operands for the tiles: items [begin, end) of
  // pack_items() (blocks of keys, values, position rows and queries).
  int64_t pack_items() const { return keys_ / 16 + keys_ / 32 + table_ / 16 + blocks_; }
  void Pack(int64_t begin, int64_t end);
  // Work items: (head, block of 16 queries).
  int64_t units() const { return a_.heads * blocks_; }
  // Items [begin, end), after every item is packed.
  void Run(int64_t begin, int64_t end) const;

 private:
  PrefillAttentionArgs a_;
  int64_t blocks_, rows_, keys_, table_;  // query blocks; padded query rows, keys, table columns
  uint16_t *qu_, *qv_, *k_, *v_, *r_;     // in the buffers
};

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_PREFILL_ATTENTION_H_
