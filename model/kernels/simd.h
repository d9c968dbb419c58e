// Vector helpers shared by model/'s CPU kernels (decode_kernels.cc,
// prefill_kernels.cc, sampling_kernels.cc, ...): GCC vector types, widening loads of float32 /
// bfloat16 / int8, horizontal sums and an 8-lane exp. Internal to those
// files: include it only from a kernel .cc.
#ifndef TXL_MODEL_KERNELS_SIMD_H_
#define TXL_MODEL_KERNELS_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace txl::simd {

// Written with GCC vector extensions, so one body serves every instruction
// set it is compiled for. (-Wpsabi would note that the vector helpers pass
// AVX values, which never cross this file's boundary.)
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12's own AVX-512 headers trip -W(maybe-)uninitialized (their
// _mm512_undefined_* placeholders) once the widening helpers are inlined.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

__attribute__((always_inline)) inline V8 Load8(const float* p) {
  V8 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// The element types as distinct C++ types: bfloat16 is its raw bits.
struct Bf16 {
  uint16_t bits;
};

// float -> bfloat16 bits, rounded to nearest even, NaN kept quiet (as
// libtorch rounds).
__attribute__((always_inline)) inline uint16_t RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__attribute__((always_inline)) inline float ToFloat(float x) { return x; }
__attribute__((always_inline)) inline float ToFloat(int8_t x) { return static_cast<float>(x); }
__attribute__((always_inline)) inline float ToFloat(Bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

typedef uint16_t U16x8 __attribute__((vector_size(16)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x8 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef int8_t I8x8 __attribute__((vector_size(8)));
typedef int8_t I8x16 __attribute__((vector_size(16)));
typedef int16_t I16x8 __attribute__((vector_size(16)));
typedef int16_t I16x16 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));
typedef int32_t I32x16 __attribute__((vector_size(64)));

// Loads a float vector V (8 or 16 lanes) from elements of type T, widening
// them: bfloat16 by shifting its bits up, int8 by conversion (its scale
// comes later).
#if !defined(__clang__)
// int8 -> float in two instructions (vpmovsxbd, vcvtdq2ps). Not
// always_inline: GCC refuses to inline a target function into the shared
// bodies, but inlines it into the flattened per-ISA entry points. (clang,
// which only the sanitizer builds use, takes the generic path.)
__attribute__((target("avx512f"))) inline V16 WidenI8x16(const int8_t* p) {
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  V16 r;
  std::memcpy(&r, &f, sizeof(r));
  return r;
}
__attribute__((target("avx2"))) inline V8 WidenI8x8(const int8_t* p) {
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  V8 r;
  std::memcpy(&r, &f, sizeof(r));
  return r;
}
// bfloat16 -> float: zero-extend to 32 bits and shift (GCC's generic code
// splits the 16-lane widening in halves).
__attribute__((target("avx512f"))) inline V16 WidenBf16x16(const void* p) {
  const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p))), 16);
  V16 r;
  std::memcpy(&r, &w, sizeof(r));
  return r;
}
__attribute__((target("avx2"))) inline V8 WidenBf16x8(const void* p) {
  const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))), 16);
  V8 r;
  std::memcpy(&r, &w, sizeof(r));
  return r;
}
// Code that runs only on AVX-512 CPUs (the AMX kernels), compiled for it.
// clang (the sanitizer builds) compiles it generically: it refuses vector
// arguments between functions of different targets.
#define TXL_AVX512 __attribute__((target("avx512f,avx512bw")))
#else
#define TXL_AVX512
#endif

// kIsa: 512 or 256 inside the AVX-512 or AVX2 entry points, 0 elsewhere
// (16-lane loads only ever run inside AVX-512 ones).
template <typename V, typename T, int kIsa = 0>
__attribute__((always_inline)) inline V LoadAs(const T* p) {
  constexpr bool kWide = sizeof(V) == 64;
  if constexpr (std::is_same_v<T, float>) {
    V r;
    std::memcpy(&r, p, sizeof(r));
    return r;
  } else if constexpr (std::is_same_v<T, Bf16>) {
#if !defined(__clang__)
    if constexpr (kIsa >= 256 && kWide) return WidenBf16x16(p);
    if constexpr (kIsa >= 256 && !kWide) return WidenBf16x8(p);
#endif
    using Narrow = std::conditional_t<kWide, U16x16, U16x8>;
    using Wide = std::conditional_t<kWide, U32x16, U32x8>;
    Narrow n;
    std::memcpy(&n, p, sizeof(n));
    const Wide w = __builtin_convertvector(n, Wide) << 16;
    V r;
    std::memcpy(&r, &w, sizeof(r));
    return r;
  } else {
#if !defined(__clang__)
    if constexpr (kIsa >= 256 && kWide) return WidenI8x16(p);
    if constexpr (kIsa >= 256 && !kWide) return WidenI8x8(p);
#endif
    // Through 16 and 32 bits: GCC 12 widens each step with vpmovsx, but
    // int8 straight to int32 or float it does one lane at a time.
    using Narrow = std::conditional_t<kWide, I8x16, I8x8>;
    using Half = std::conditional_t<kWide, I16x16, I16x8>;
    using Int = std::conditional_t<kWide, I32x16, I32x8>;
    Narrow n;
    std::memcpy(&n, p, sizeof(n));
    return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(n, Half), Int), V);
  }
}

// RoundBf16 of eight floats (the same bits, NaN included).
__attribute__((always_inline)) inline U16x8 RoundBf16x8(V8 x) {
  U32x8 u;
  std::memcpy(&u, &x, sizeof(u));
  const U32x8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U32x8 nan = {0x7fc0, 0x7fc0, 0x7fc0, 0x7fc0, 0x7fc0, 0x7fc0, 0x7fc0, 0x7fc0};
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded, U16x8);
}

// The 2 * lanes bfloat16 values at p as two float vectors, the
// even-indexed elements and the odd ones: one load and two bit operations,
// where widening in order takes a shuffle per lanes. A dot product with a
// vector stored de-interleaved the same way needs nothing more.
template <typename V>
__attribute__((always_inline)) inline void SplitBf16(const Bf16* p, V* even, V* odd) {
  using Wide = std::conditional_t<sizeof(V) == 64, U32x16, U32x8>;
  Wide u;
  std::memcpy(&u, p, sizeof(u));
  const Wide e = u << 16, o = u & 0xffff0000u;
  std::memcpy(even, &e, sizeof(e));
  std::memcpy(odd, &o, sizeof(o));
}

#if !defined(__clang__)
// VDPBF16PS: per lane, acc += w's bfloat16 pair times x's (one pair, the
// same in every lane), each product exact in float32, the odd one added
// first, denormals flushed (as the instruction is specified). Only inside
// RunAvx512Bf16 (cpu_isa.h), which is compiled for it and inlines it (not
// always_inline: its callers are not compiled for the target themselves).
__attribute__((target("avx512f,avx512bf16"))) inline V16 DotBf16Pairs(V16 acc, V16 w, uint32_t x) {
  const __m512i xs = _mm512_set1_epi32(static_cast<int>(x));
  return (V16)_mm512_dpbf16_ps((__m512)acc, (__m512bh)w, (__m512bh)xs);
}

typedef int32_t I32x16 __attribute__((vector_size(64)));
// VPDPBUSD: per lane, acc += the four unsigned bytes of w times the four
// signed bytes of x (the same in every lane), exact in int32. Only inside
// RunAvx512Vnni (cpu_isa.h), as DotBf16Pairs.
__attribute__((target("avx512f,avx512vnni"))) inline I32x16 DotU8S8Quads(I32x16 acc, I32x16 w, uint32_t x) {
  const __m512i xs = _mm512_set1_epi32(static_cast<int>(x));
  return (I32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)w, xs);
}
#endif

__attribute__((always_inline)) inline float Sum8(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// The sum of an 8- or 16-lane vector's lanes.
template <typename V>
__attribute__((always_inline)) inline float SumLanes(V v) {
  if constexpr (sizeof(V) == sizeof(V8)) {
    return Sum8(v);
  } else {
    V8 lo, hi;
    std::memcpy(&lo, &v, sizeof(lo));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
    return Sum8(lo + hi);
  }
}

// exp(x) for x <= 0 in 8 or 16 lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by
// its Taylor series to r^7 (truncation below 1 ulp), times 2^n built in the
// exponent bits. Inputs below -87 give e^-87 (a normal float; the caller
// zeroes lanes that must not count).
template <typename V>
__attribute__((always_inline)) inline V Exp(V x) {
  typedef int32_t Vi __attribute__((vector_size(sizeof(V))));
  const V lowest = V{} - 87.f;
  x = x < lowest ? lowest : x;
  // n = round(x / ln2): adding 1.5 * 2^23 leaves the integer in the low mantissa bits.
  const V shifted = x * 1.44269504088896341f + 12582912.f;
  const V nf = shifted - 12582912.f;
  Vi n;
  std::memcpy(&n, &shifted, sizeof(n));
  n -= 0x4B400000;
  const V r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;  // ln2 in two parts
  V p = r * (1.f / 5040) + (1.f / 720);
  p = p * r + (1.f / 120);
  p = p * r + (1.f / 24);
  p = p * r + (1.f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const Vi bits = (n + 127) << 23;
  V two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}
__attribute__((always_inline)) inline V8 Exp8(V8 x) { return Exp(x); }

// RoundBf16 of sixteen floats.
__attribute__((always_inline)) inline U16x16 RoundBf16x16(V16 x) {
  U32x16 u;
  std::memcpy(&u, &x, sizeof(u));
  const U32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U32x16 nan = U32x16{} + 0x7fc0u;
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded, U16x16);
}

}  // namespace txl::simd

#endif  // TXL_MODEL_KERNELS_SIMD_H_
