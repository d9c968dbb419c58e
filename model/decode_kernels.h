// The CPU kernels of a decode step (every session feeds one token): the
// attention of one query per (session, head) over its ring memory, read in
// place; the matrix-vector products of a one-session step; and the products
// of a several-session step from panel-packed weights. Torch-free:
// plain float arrays; the caller (incremental.cc) splits the work over
// threads, each call covering a range of work items.
//
// Each is compiled for several instruction sets; kBest picks the widest this
// CPU runs (tests name the others, so every variant is checked here).
#ifndef TXL_MODEL_DECODE_KERNELS_H_
#define TXL_MODEL_DECODE_KERNELS_H_

#include <cstdint>

namespace txl {

// kAvx512 applies to PackedProduct; the others use AVX2 for it.
enum class KernelIsa { kBest, kPlain, kAvx2, kAvx512 };
bool CpuRuns(KernelIsa isa);

// One session's view of one layer's memory.
struct DecodeSession {
  float* k;  // ring [H, cap, dh] of this layer (null when mem_len == 1)
  float* v;
  int64_t cap, mem_len;
  int64_t position;  // of the new token
  int64_t length;    // positions held (all attended)
};

struct DecodeAttentionArgs {
  const DecodeSession* sessions;
  int64_t batch, H, dh;
  int64_t width;     // the most keys of any session (length + 1): row buffer size
  const float* qkv;  // [B, 3, H, dh]: query, new key, new value
  const float* u;    // [H, dh]: content bias (r_w_bias), added to the query
  const float* v;    // [H, dh]: position bias (r_r_bias)
  const float* rel;  // [H, rel_size, dh]: W_r R at distance d in row d
  int64_t rel_size;
  float scale;
  float* out;  // [B, H, dh]
};

// Items [begin, end) of batch * H, head-major (item = h * batch + b), so that
// a run of items reads one head's relative-position rows from cache. Each
// item attends its held keys and the new one, and finally writes the new key
// and value into the ring slot of the position that left the window (never a
// held one, so a step that fails later changes nothing the session holds).
void DecodeAttention(const DecodeAttentionArgs& args, int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

// y[r] = w[r, :cols] . x (+ bias[r]) for rows [begin, end) of the row-major
// matrix w with row stride ld (>= cols: a column block of a wider matrix),
// then max(0, y[r]) when relu; bias may be null. Every weight is read once,
// streaming: a one-token step is bound by reading its weights.
void GemvRows(const float* w, int64_t ld, const float* x, const float* bias, bool relu, float* y, int64_t cols,
              int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

// Weights packed for products with a few rows (a decode step of several
// sessions): panels of kPanel output rows, each panel [cols, kPanel]
// contiguous, so a panel streams once from memory and is then reused from
// cache for every input row. (A BLAS packs the whole matrix on every call.)
inline constexpr int64_t kPanel = 64;
// Floats of w [rows, cols] packed: rows rounded up to whole panels.
int64_t PackedSize(int64_t rows, int64_t cols);
void PackPanels(const float* w, int64_t rows, int64_t cols, float* packed);

// y[m, r] = x[m, :] . w[r, :] (+ bias[r]) for m < batch and the rows r of
// panels [begin, end), then max(0, y) when relu; x is [batch, cols], y is
// [batch, rows], both row-major; bias may be null.
void PackedProduct(const float* packed, int64_t rows, int64_t cols, const float* x, int64_t batch, const float* bias,
                   bool relu, float* y, int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

}  // namespace txl

#endif  // TXL_MODEL_DECODE_KERNELS_H_
