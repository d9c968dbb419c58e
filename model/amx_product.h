// Several sessions' products with bfloat16 weights on AMX tiles: the panels
// of decode_kernels.h (column pairs) are the tiles' weight operand as
// packed, and x is rounded to bfloat16 rows. Internal to model/'s kernels
// (decode_kernels.cc dispatches to it); torch-free.
#ifndef TXL_MODEL_AMX_PRODUCT_H_
#define TXL_MODEL_AMX_PRODUCT_H_

#include <cstdint>

#include "model/amx_tiles.h"
#include "model/decode_kernels.h"

namespace txl {

// PackedProduct of bfloat16 weights with bf16_products, on AMX: panels
// [begin, end) of w. Needs CpuRunsAmx() and PanelStride a multiple of 32.
void AmxProduct(const PackedMatrix& w, const float* x, int64_t batch, const float* bias, bool relu, float* y,
                int64_t begin, int64_t end);

}  // namespace txl

#endif  // TXL_MODEL_AMX_PRODUCT_H_
