#include "model/kernels/cpu_isa.h"

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

}  // namespace txl
