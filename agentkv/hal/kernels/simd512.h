// The horizontal sums of the AVX-512 builds (qmatmul512.cpp, attention512.cpp). Include only
// under their target pragma, after simd.h, with AGENTKV_ISA set to the AVX-512 namespace.
#pragma once

#include "simd.h"

namespace agentkv {
inline namespace AGENTKV_ISA {

// The 16 lanes' sum: halves added, then simd.h's fixed 8-lane tree.
static inline float hsum16(__m512 v) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// Four accumulators' sums at once:
//   [sum(a0), sum(a1), sum(a2), sum(a3)], sum(a) = ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))
// with x_i = a[i] + a[i + 8]. Each lane's tree reads only its own accumulator, so a sum has
// the same bits in any slot, or alone with zeros beside it.
static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const auto half = [](__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(half(a0), half(a1)), _mm256_hadd_ps(half(a2), half(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

}  // namespace AGENTKV_ISA
}  // namespace agentkv
