#include "model/kernels/amx_tiles.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "model/kernels/cpu_isa.h"

namespace txl {

namespace {
// The LDTILECFG operand: palette 1, then per tile its bytes per row and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
}  // namespace

bool CpuRunsAmx() {
  static const bool runs = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    // CPUID.7.0:EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1)) return false;
    if (CpuFamilyInUse() != CpuFamily::kAmx) return false;  // TXL_CPU_ISA names a narrower family
    // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM
    // for XFEATURE_XTILEDATA); without it the first tile instruction traps.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return runs;
}

AmxTiles::AmxTiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(config));
}

AmxTiles::~AmxTiles() { asm volatile("tilerelease" ::: "memory"); }

}  // namespace txl
