// Several sessions' products with bfloat16 weights on AMX tiles: the panels
// of decode_kernels.h (column pairs) are the tiles' weight operand as
// packed, and x is rounded to bfloat16 rows. Internal to model/'s kernels:
// decode_kernels.cc dispatches to it, so it takes the panels as plain
// arrays rather than that header's types. Torch-free.
#ifndef TXL_MODEL_KERNELS_AMX_PRODUCT_H_
#define TXL_MODEL_KERNELS_AMX_PRODUCT_H_

#include <cstdint>

#include "model/kernels/amx_tiles.h"

namespace txl {

// Output rows per panel (decode_kernels.h's kPanel, which must equal it).
inline constexpr int64_t kAmxPanel = 64;

// PackedProduct of bfloat16 weights with bf16_products, on AMX: y [batch,
// rows] = x [batch, cols] times the weights' transpose, plus bias, rectified
// when relu, for the output rows of panels [begin, end). `panels` holds
// bfloat16 bits in pairs layout, `stride` (a multiple of 32) columns per
// panel. Needs CpuRunsAmx().
void AmxProduct(const uint16_t* panels, int64_t rows, int64_t cols, int64_t stride, const float* x, int64_t batch,
                const float* bias, bool relu, float* y, int64_t begin, int64_t end);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_AMX_PRODUCT_H_
