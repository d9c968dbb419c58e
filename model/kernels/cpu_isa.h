// The instruction sets the CPU kernels are compiled for, and the one way a
// kernel picks among them (after CTranslate2's cpu_isa.h): a kernel is a
// struct with `template <int kBits> static void Run(args...)`, where kBits is
// 512 (AVX-512), 256 (AVX2 + FMA) or 0 (plain C++), and DispatchIsa runs it
// compiled for the set asked for. Kernel sources only (it needs no torch).
#ifndef TXL_MODEL_KERNELS_CPU_ISA_H_
#define TXL_MODEL_KERNELS_CPU_ISA_H_

#include <utility>

namespace txl {

// kBest: the widest this CPU runs. Tests name the others, so every variant is
// checked on a CPU that has it.
enum class KernelIsa { kBest, kPlain, kAvx2, kAvx512 };

// The CPU families the kernels tell apart, narrowest first: each adds
// instructions to the one before. The environment variable TXL_CPU_ISA
// (plain, avx2, avx512, avx512_bf16, amx) caps what the kernels use at the
// family it names, so a wider CPU runs a narrower one's paths: the tests run
// each family the CPU has. An unknown name is reported once and ignored.
enum class CpuFamily { kPlain, kAvx2, kAvx512, kAvx512Bf16, kAmx };
// The widest family this CPU has, capped by TXL_CPU_ISA.
CpuFamily CpuFamilyInUse();
// Whether the CPU has it (whatever TXL_CPU_ISA says), and its name.
bool CpuHasFamily(CpuFamily family);
const char* CpuFamilyName(CpuFamily family);
bool CpuRuns(KernelIsa isa);
// kBest resolved to the widest set this CPU runs; a named set the CPU lacks
// falls back to that too.
KernelIsa ResolveIsa(KernelIsa isa);
// "avx512", "avx2" or "plain" (kBest resolved).
const char* IsaName(KernelIsa isa);
inline const char* BestIsaName() { return IsaName(KernelIsa::kBest); }
// The CPU has AMX's bfloat16 tiles.
bool CpuHasAmx();
// The CPU has fast bfloat16 matrix products (AMX tiles or AVX-512-BF16), as
// oneDNN runs them; elsewhere they would run a slow reference path, so the
// prefill widens the weights instead.
bool CpuHasBf16Products();

// The kBits of AVX-512 kernels that also use its bfloat16 dot product
// (VDPBF16PS, the avx512_bf16 family): wider than 512, so `kBits >= 512`
// picks the 16-lane bodies.
constexpr int kBitsAvx512Bf16 = 513;
// ... and of those that use VNNI's byte dot product (VPDPBUSD).
constexpr int kBitsAvx512Vnni = 514;

namespace isa_internal {
// The entry points, one per set: each is compiled for its set, and `flatten`
// inlines the kernel's whole body into it (so the shared template bodies get
// that set's code). clang (the sanitizer builds only) has no flatten here.
#if defined(__clang__)
#define TXL_ISA_FLATTEN
#else
#define TXL_ISA_FLATTEN __attribute__((flatten))
#endif
template <class Kernel, class... A>
TXL_ISA_FLATTEN __attribute__((target("avx512f,avx512bw"))) void RunAvx512(A&&... a) {
  Kernel::template Run<512>(std::forward<A>(a)...);
}
template <class Kernel, class... A>
TXL_ISA_FLATTEN __attribute__((target("avx2,fma"))) void RunAvx2(A&&... a) {
  Kernel::template Run<256>(std::forward<A>(a)...);
}
// AVX-512 with its bfloat16 dot product (VDPBF16PS): kBits is
// kBitsAvx512Bf16. Only the kernels that use the dot product are dispatched
// here (DispatchBf16Dot); the others take RunAvx512.
template <class Kernel, class... A>
TXL_ISA_FLATTEN __attribute__((target("avx512f,avx512bw,avx512bf16"))) void RunAvx512Bf16(A&&... a) {
  Kernel::template Run<kBitsAvx512Bf16>(std::forward<A>(a)...);
}
// AVX-512 with VNNI's byte dot product: kBits is kBitsAvx512Vnni
// (DispatchInt8Dot).
template <class Kernel, class... A>
TXL_ISA_FLATTEN __attribute__((target("avx512f,avx512bw,avx512vnni"))) void RunAvx512Vnni(A&&... a) {
  Kernel::template Run<kBitsAvx512Vnni>(std::forward<A>(a)...);
}
template <class Kernel, class... A>
void RunPlain(A&&... a) {
  Kernel::template Run<0>(std::forward<A>(a)...);
}
#undef TXL_ISA_FLATTEN
}  // namespace isa_internal

// Runs Kernel::Run<kBits>(a...) compiled for `isa` (resolved by ResolveIsa).
template <class Kernel, class... A>
void DispatchIsa(KernelIsa isa, A&&... a) {
  switch (ResolveIsa(isa)) {
    case KernelIsa::kAvx512: return isa_internal::RunAvx512<Kernel>(std::forward<A>(a)...);
    case KernelIsa::kAvx2: return isa_internal::RunAvx2<Kernel>(std::forward<A>(a)...);
    default: return isa_internal::RunPlain<Kernel>(std::forward<A>(a)...);
  }
}

// Whether DispatchBf16Dot runs the dot product for `isa`: AVX-512 asked
// for (or kBest), and the family in use has AVX-512-BF16. GCC builds only:
// clang (the sanitizer builds) has no flatten to carry the target inward.
bool CpuRunsBf16Dot(KernelIsa isa);

// Runs Kernel::Run<kBitsAvx512Bf16>(a...) where CpuRunsBf16Dot(isa), else
// as DispatchIsa does.
template <class Kernel, class... A>
void DispatchBf16Dot(KernelIsa isa, A&&... a) {
#if !defined(__clang__)
  if (CpuRunsBf16Dot(isa)) return isa_internal::RunAvx512Bf16<Kernel>(std::forward<A>(a)...);
#endif
  DispatchIsa<Kernel>(isa, std::forward<A>(a)...);
}

// Whether int8 products may run VPDPBUSD for `isa`: as CpuRunsBf16Dot,
// and the CPU has AVX-512-VNNI. Every CPU with AVX-512-BF16 has it (Cooper
// Lake, Sapphire Rapids, Zen 4 and 5); one with VNNI alone (Cascade Lake,
// Ice Lake) is the avx512 family and widens int8 instead.
bool CpuRunsInt8Dot(KernelIsa isa);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_CPU_ISA_H_
