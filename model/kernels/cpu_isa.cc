#include "model/kernels/cpu_isa.h"

#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace txl {
namespace {

// CPUID itself: clang 14, the sanitizer builds' compiler, cannot name these
// features in __builtin_cpu_supports.
bool Leaf7(unsigned sub, int reg, int bit) {
  unsigned r[4] = {};
  return __get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3]) && (r[reg] >> bit & 1);
}

const char* const kFamilyNames[] = {"plain", "avx2", "avx512", "avx512_bf16", "amx"};

// TXL_CPU_ISA's cap (kAmx: none).
CpuFamily Cap() {
  static const CpuFamily cap = [] {
    const char* name = std::getenv("TXL_CPU_ISA");
    if (name == nullptr || *name == '\0') return CpuFamily::kAmx;
    for (int f = 0; f <= static_cast<int>(CpuFamily::kAmx); ++f) {
      if (std::strcmp(name, kFamilyNames[f]) == 0) return static_cast<CpuFamily>(f);
    }
    std::fprintf(stderr, "warning: TXL_CPU_ISA=%s is none of plain, avx2, avx512, avx512_bf16, amx: ignored\n", name);
    return CpuFamily::kAmx;
  }();
  return cap;
}

bool Allowed(CpuFamily family) { return static_cast<int>(family) <= static_cast<int>(Cap()); }

}  // namespace

bool CpuHasFamily(CpuFamily family) {
  switch (family) {
    case CpuFamily::kAmx: return Leaf7(0, 3, 22) && Leaf7(0, 3, 24);  // AMX-BF16, AMX-TILE
    case CpuFamily::kAvx512Bf16: return CpuHasFamily(CpuFamily::kAvx512) && Leaf7(1, 0, 5);
    case CpuFamily::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    case CpuFamily::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return true;
  }
}

CpuFamily CpuFamilyInUse() {
  static const CpuFamily in_use = [] {
    for (int f = static_cast<int>(CpuFamily::kAmx); f > 0; --f) {
      const auto family = static_cast<CpuFamily>(f);
      if (Allowed(family) && CpuHasFamily(family)) return family;
    }
    return CpuFamily::kPlain;
  }();
  return in_use;
}

const char* CpuFamilyName(CpuFamily family) { return kFamilyNames[static_cast<int>(family)]; }

bool CpuRuns(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAvx512: return Allowed(CpuFamily::kAvx512) && CpuHasFamily(CpuFamily::kAvx512);
    case KernelIsa::kAvx2: return Allowed(CpuFamily::kAvx2) && CpuHasFamily(CpuFamily::kAvx2);
    default: return true;
  }
}

KernelIsa ResolveIsa(KernelIsa isa) {
  static const KernelIsa best = CpuRuns(KernelIsa::kAvx512) ? KernelIsa::kAvx512
                                : CpuRuns(KernelIsa::kAvx2) ? KernelIsa::kAvx2
                                                            : KernelIsa::kPlain;
  if (isa == KernelIsa::kBest || !CpuRuns(isa)) return best;
  return isa;
}

const char* IsaName(KernelIsa isa) {
  switch (ResolveIsa(isa)) {
    case KernelIsa::kAvx512: return "avx512";
    case KernelIsa::kAvx2: return "avx2";
    default: return "plain";
  }
}

bool CpuRunsBf16Dot(KernelIsa isa) {
#if defined(__clang__)
  (void)isa;
  return false;
#else
  return ResolveIsa(isa) == KernelIsa::kAvx512 &&
         static_cast<int>(CpuFamilyInUse()) >= static_cast<int>(CpuFamily::kAvx512Bf16);
#endif
}

bool CpuRunsInt8Dot(KernelIsa isa) { return CpuRunsBf16Dot(isa) && Leaf7(0, 2, 11); }  // ECX 11: AVX512_VNNI

bool CpuHasAmx() { return Allowed(CpuFamily::kAmx) && CpuHasFamily(CpuFamily::kAmx); }

bool CpuHasBf16Products() {
  return (Allowed(CpuFamily::kAvx512Bf16) && Leaf7(1, 0, 5) && CpuHasFamily(CpuFamily::kAvx512)) || CpuHasAmx();
}

}  // namespace txl
