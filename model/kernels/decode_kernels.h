// The CPU kernels of a decode step (every session feeds one token): the
// attention of one query per (session, head) over its ring memory, read in
// place; the matrix-vector products of a one-session step; and the products
// of a several-session step from panel-packed weights. Torch-free:
// plain arrays of float32, bfloat16 or int8; the caller (incremental.cc) splits the work over
// threads, each call covering a range of work items.
//
// Each is compiled for several instruction sets (cpu_isa.h).
#ifndef TXL_MODEL_KERNELS_DECODE_KERNELS_H_
#define TXL_MODEL_KERNELS_DECODE_KERNELS_H_

#include <cstdint>

#include "model/kernels/cpu_isa.h"

namespace txl {

// KernelIsa (cpu_isa.h): kAvx512 applies to PackedProduct, DecodeAttention and
// the reduced-precision GemvRows; float32 GemvRows use AVX2 for it.
// PackedProduct's bfloat16 products run on AMX tiles under kAvx512 (and
// kBest) where the CPU has them.

// What the kernels read: float32, bfloat16 (the upper half of a float32's
// bits, rounded to nearest even) or int8 (times a float scale per row). The
// products always multiply and accumulate in float32: a reduced type only
// moves fewer bytes.
enum class Elem : uint8_t { kF32, kBf16, kI8 };
int64_t ElemBytes(Elem e);
// float -> bfloat16 bits, rounded to nearest even (as libtorch rounds).
uint16_t ToBf16(float f);
// Rounds n floats to the nearest bfloat16 value, in place.
void RoundToBf16(float* x, int64_t n);

// The matrix a one-session product reads (or the block of one starting at
// a row and column): row-major, or float32 or bfloat16 packed in panels
// (PackPanels below), which models keep instead of a second, row-major copy.
struct WeightMatrix {
  const void* data = nullptr;
  Elem elem = Elem::kF32;
  const float* scale = nullptr;  // int8: one per row, else null
  int64_t ld = 0;                // row stride, in elements; panels: PanelStride of the matrix's columns
  bool panels = false;           // not int8; a block's row is then a multiple of kPanel (bfloat16: its column even)
  // bfloat16 and int8 rows: GemvRows fetches the same columns this many rows
  // ahead (0: leaves it to the hardware). Results do not depend on it.
  int64_t ahead = 0;
  WeightMatrix Block(int64_t row, int64_t col) const;
};

// One session's view of one layer's memory.
struct DecodeSession {
  void* k;  // ring [H, cap, dh] of this layer, of DecodeAttentionArgs::kv (null when mem_len == 1)
  void* v;
  int64_t cap, mem_len;
  int64_t position;  // of the new token
  int64_t length;    // positions held (all attended)
};

struct DecodeAttentionArgs {
  const DecodeSession* sessions;
  int64_t batch, H, dh;
  int64_t width;    // the most keys of any session (length + 1): row buffer size
  float* qkv;       // [B, 3, H, dh]: query, new key, new value (rounded to kv's type in place)
  const float* u;   // [H, dh]: content bias (r_w_bias), added to the query
  const float* v;   // [H, dh]: position bias (r_r_bias)
  const void* rel;  // [H, rel_size, dh] of rel_elem: W_r R at distance d in row d
  int64_t rel_size;
  float scale;
  float* out;                  // [B, H, dh]
  Elem kv = Elem::kF32;        // the rings' type: kF32 or kBf16
  Elem rel_elem = Elem::kF32;  // kF32 or kBf16
};

// Items [begin, end) of batch * H, head-major (item = h * batch + b), so that
// a run of items reads one head's relative-position rows from cache. Each
// item attends its held keys and the new one, and finally writes the new key
// and value into the ring slot of the position that left the window (never a
// key this pass attends; a step's first pass overwrites nothing the session
// held before it, and IncrementalModel::Step backs up what later ones do).
// With bfloat16 rings the new key and value are rounded first, so the step
// attends exactly what later steps will read.
void DecodeAttention(const DecodeAttentionArgs& args, int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

// y[r] = w[r, :cols] . x (+ bias[r]) for rows [begin, end) of w, then
// max(0, y[r]) when relu; bias may be null. Every weight is read once,
// streaming: a one-token step is bound by reading its weights. From panels,
// each output is summed over the columns in order, as PackedProduct sums it
// with x in float32 (the same bits for the same columns), on any vector
// width.
void GemvRows(const WeightMatrix& w, const float* x, const float* bias, bool relu, float* y, int64_t cols,
              int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

// Weights packed for products with a few rows (a decode step of several
// sessions): panels of kPanel output rows, each panel [cols, kPanel]
// contiguous, so a panel streams once from memory and is then reused from
// cache for every input row. (A BLAS packs the whole matrix on every call.)
// bfloat16 panels hold columns in pairs, [stride / 2, kPanel, 2]: the weight
// operand of AMX's bfloat16 tiles as it is, and on other CPUs one load
// splits into the even and the odd column (SplitBf16). int8 panels for
// int8 products (VPDPBUSD) hold columns in quads, [stride / 4, kPanel, 4],
// each weight plus 128 as an unsigned byte (the instruction's unsigned
// operand).
inline constexpr int64_t kPanel = 64;
// Columns a panel holds: cols, rounded up to a multiple of 32 for bfloat16
// (whole AMX tiles) and of 4 for int8 (whole quads), the rest zero.
inline int64_t PanelStride(int64_t cols, Elem elem) {
  return elem == Elem::kBf16 ? (cols + 31) / 32 * 32 : elem == Elem::kI8 ? (cols + 3) / 4 * 4 : cols;
}
// Elements of w [rows, cols] of elem packed: rows rounded up to whole panels.
int64_t PackedSize(int64_t rows, int64_t cols, Elem elem);
// Packs w (its elem; int8 keeps w.scale, which PackedMatrix shares), int8
// in quads where int8_products (PackedMatrix::int8_products).
void PackPanels(const WeightMatrix& w, int64_t rows, int64_t cols, void* packed, bool int8_products = false);

struct PackedMatrix {
  const void* data = nullptr;
  Elem elem = Elem::kF32;
  const float* scale = nullptr;  // int8: one per row
  int64_t rows = 0, cols = 0;
  // bfloat16 only: x is rounded to bfloat16 too, and the exact products
  // are summed in float32 a column pair at a time, even then odd: AMX's
  // tdpbf16ps, and where the CPU has no AMX the same sums in float32 (which
  // agree to summation order). False: x stays float32 and the weights are
  // widened (CPUs without bfloat16 products).
  bool bf16_products = false;
  // int8 only, packed in quads (CpuRunsInt8Dot): x is quantized to int8 per
  // row (scale max|x| / 127, rounded to nearest) and each row's products are
  // integer dot products (VPDPBUSD), exact in int32, scaled once at the end.
  // False: x stays float32 and the weights are widened.
  bool int8_products = false;
};
// y[m, r] = x[m, :] . w[r, :] (+ bias[r]) for m < batch and the rows r of
// panels [begin, end), then max(0, y) when relu; x is [batch, cols], y is
// [batch, rows], both row-major; bias may be null.
void PackedProduct(const PackedMatrix& w, const float* x, int64_t batch, const float* bias, bool relu, float* y,
                   int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_DECODE_KERNELS_H_
