#include "model/kernels/cpu_isa.h"

#include <cpuid.h>

namespace txl {

bool CpuRuns(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    case KernelIsa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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

// From CPUID itself: clang 14, the sanitizer builds' compiler, cannot name
// these features in __builtin_cpu_supports.
bool CpuHasAmx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1);  // AMX-BF16
}

bool CpuHasBf16Products() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
  return avx512_bf16 || CpuHasAmx();
}

}  // namespace txl
