// SIMD helpers shared by every kernel: the one horizontal sum and the one exp.
//
// Batch invariance rests on these being the *only* reduction tree and the *only* exp: every
// output element, whatever path computed it (decode, prefill tile, tail column), ends with
// the same instruction sequence. The build passes -ffp-contract=off so that the compiler
// never fuses a scalar a*b+c on one path and not on another.
#pragma once

#include <immintrin.h>
#include <cstdint>
#include <cstring>

// Each instruction-set build of these headers gets its own namespace (qmatmul512.cpp defines
// AGENTKV_ISA before including them), so the linker can never fold an AVX-512 copy of an
// inline function into the AVX2 code that must run on CPUs without AVX-512.
#ifndef AGENTKV_ISA
#define AGENTKV_ISA isa_avx2
#endif

namespace agentkv {
inline namespace AGENTKV_ISA {

// Fixed tree: (lo128 + hi128), then (x0+x2, x1+x3), then (.. + ..). Never reassociated.
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

static inline float fp16_to_f32(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// 8 bytes (unsigned) -> 8 floats, and the signed variant.
static inline __m256 u8x8_to_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
static inline __m256 i8x8_to_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// 32 unsigned bytes -> 4 x 8 floats in byte order.
static inline void u8x32_to_ps(__m256i v, __m256 out[4]) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    out[0] = u8x8_to_ps(lo);
    out[1] = u8x8_to_ps(_mm_unpackhi_epi64(lo, lo));
    out[2] = u8x8_to_ps(hi);
    out[3] = u8x8_to_ps(_mm_unpackhi_epi64(hi, hi));
}

// exp for x <= ~88 (Cephes expf: range reduction by ln2 in two parts, degree-5 polynomial,
// scale by 2^n through the exponent bits). About 1 ulp; inputs below -87.3 give 0 or a
// tiny value. One code path for every element: callers never use a scalar exp for tails.
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505531f);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    fx = _mm256_floor_ps(_mm256_add_ps(fx, _mm256_set1_ps(0.5f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    __m256 x2 = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}

// decode_cols' prefetch (row_groups.h): a call reads G weight rows, one per stream, and the
// next call the row after each; this fetches the row ahead_rows on in each stream, spread
// over the blocks of the rows being read (a slice per block step, by line), ahead_rows =
// 1 + STREAM_AHEAD_BYTES / row_bytes so short rows (a 640-wide Q8_0 row is 680 bytes) do not
// prefetch what the hardware already has on the way.
constexpr int64_t STREAM_AHEAD_BYTES = 4096;
template <int G>
struct NextInStreams {
    const uint8_t* const* rows;
    int64_t ahead, step;
    NextInStreams(const uint8_t* const* stream_rows, int64_t row_bytes, int64_t blocks)
        : rows(stream_rows),
          ahead((1 + STREAM_AHEAD_BYTES / row_bytes) * row_bytes),
          step((row_bytes + blocks - 1) / blocks) {}
    inline void at(int64_t sb) const {
        for (int g = 0; g < G; ++g) {
            const uint8_t* base = rows[g] + ahead;
            const uintptr_t end = reinterpret_cast<uintptr_t>(base + (sb + 1) * step);
            for (uintptr_t a = reinterpret_cast<uintptr_t>(base + sb * step) & ~uintptr_t(63); a < end; a += 64)
                _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
        }
    }
};

// Lane mask with the first `count` lanes set (0 <= count <= 8), for masked loads of tails.
static inline __m256i lane_mask(int count) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), idx);
}

}  // namespace AGENTKV_ISA
}  // namespace agentkv
