// What every AMX kernel in model/ shares: whether this process may use the
// tiles, and the one tile shape they all use. Internal to model/'s kernels
// (amx_product.cc, prefill_attention.cc); torch-free.
//
// Every tile is 16 rows of 64 bytes: 16 floats of sums, 32 bfloat16 of a
// left operand, or 16 column pairs of a right operand (the pairs layout of
// decode_kernels.h). Instructions name tiles by number, so each kernel fixes
// its own register use in its inline assembly.
#ifndef TXL_MODEL_KERNELS_AMX_TILES_H_
#define TXL_MODEL_KERNELS_AMX_TILES_H_

#include <cstdint>

namespace txl {

// The CPU has AMX-BF16 and the kernel lets this process use the tile data
// (asked for once, on the first call).
bool CpuRunsAmx();

// Loads the 16 x 64-byte configuration of all eight tiles on this thread
// (on construction) and releases the tiles (on destruction): a kernel's
// work on one thread sits inside one.
class AmxTiles {
 public:
  AmxTiles();
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_AMX_TILES_H_
