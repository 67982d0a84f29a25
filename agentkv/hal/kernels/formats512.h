// AVX-512 decoders of the 16-bit float and agentkv group-32 formats (quant.h has the AVX2
// ones and the layouts), and the K-quant scale products. Include only from qmatmul512.cpp,
// under its target pragma, after quant.h.
// Each yields the same values as its AVX2 decoder, in the 2 x 16 lanes and the
// prepare/decode shape of qmatmul512.cpp's decoders; F16 and F8G32 reuse the AVX2 code.
#pragma once

#include "quant.h"

namespace agentkv {
inline namespace AGENTKV_ISA {
namespace formats512 {

struct NoCtx {};

// A Q4_K/Q5_K block's sixteen scale products: lanes 0..7 d * scale_j, 8..15 dmin * min_j
// (each one IEEE product, the scalar loop's values).
static inline __m512 k4_scale_products(const uint8_t* b) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(scale_min_k4_bytes(b + 4)));
    const __m512 dd = _mm512_mask_blend_ps(static_cast<__mmask16>(0xFF00), _mm512_set1_ps(fp16_to_f32(b)),
                                           _mm512_set1_ps(fp16_to_f32(b + 2)));
    return _mm512_mul_ps(dd, v);
}

static inline __m512 bcast_f32(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_ps(v);
}

static inline __m512 u8x16(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// 16 halves per vcvtph2ps: the values of quant.h's FmtF16 in the same lanes, without joining
// four 8-lane conversions.
struct WF16 {
    static constexpr int QK = 32, BYTES = 64, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        for (int i = 0; i < 2; ++i)
            out[i] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * i)));
    }
};

struct WBF16 {
    static constexpr int QK = 32, BYTES = 64, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        for (int i = 0; i < 2; ++i) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * i));
            out[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
    }
};

// (q - zero) * scale, as FmtI4G32 / FmtI8G32.
struct WI4G32 {
    static constexpr int QK = 32, BYTES = 24, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        const __m512 s = bcast_f32(b), z = bcast_f32(b + 4);
        const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8)));
        out[0] = _mm512_cvtepi32_ps(_mm512_and_si512(a, _mm512_set1_epi32(0x0F)));
        out[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(a, 4));
        for (int i = 0; i < 2; ++i) out[i] = _mm512_mul_ps(_mm512_sub_ps(out[i], z), s);
    }
};

struct WI8G32 {
    static constexpr int QK = 32, BYTES = 40, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        const __m512 s = bcast_f32(b), z = bcast_f32(b + 4);
        for (int i = 0; i < 2; ++i) out[i] = _mm512_mul_ps(_mm512_sub_ps(u8x16(b + 8 + 16 * i), z), s);
    }
};

}  // namespace formats512
}  // namespace AGENTKV_ISA
}  // namespace agentkv
