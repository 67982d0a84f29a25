// MXFP4 (gguf type 39) for the AVX2 build, and the E8M0 scale both builds share.
//
// Layout (17 bytes, ggml's block_mxfp4): e E8M0, qs[16]; weight i's code is the low nibble of
// qs[i] (i < 16) or the high nibble of qs[i - 16] (Q4_0's order). w = KV[q] * e8m0_half(e),
// KV the E2M1 values doubled (formats/quants/mxfp4.py). Every such product is a power of two
// times an integer below 16: exact in f32 (a subnormal for e < 2, exact too while the CPU
// keeps subnormals, which torch's default does), so the weights equal gguf-py's however they
// are formed: here an int8 table lookup (vpshufb), a convert and one multiply.
// Include after quant.h / simd.h, under the build's AGENTKV_ISA.
#pragma once

#include "simd.h"

namespace agentkv {
inline namespace AGENTKV_ISA {

constexpr int MXFP4 = 39;

// 2^(e - 128) from its f32 bits, as ggml_e8m0_to_fp32_half: e = 0, 1 are the subnormals
// 2^-128, 2^-127; e = 255 is 2^127 (gguf-py does not treat it as NaN either).
static constexpr float e8m0_half(uint8_t e) {
    return __builtin_bit_cast(float, e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// e8m0_half of every byte, built at compile time (one private copy per ISA build): a decoder
// reads a block's scale as one indexed load (for AVX-512, straight into the table's broadcast
// multiply) instead of converting it.
struct E8M0Halves {
    float v[256];
};
static constexpr E8M0Halves make_e8m0_halves() {
    E8M0Halves t{};
    for (int e = 0; e < 256; ++e)
        t.v[e] = e8m0_half(static_cast<uint8_t>(e));
    return t;
}
static constexpr E8M0Halves E8M0_HALF = make_e8m0_halves();

struct FmtMXFP4 {
    static constexpr int QK = 32, BYTES = 17;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(E8M0_HALF.v[b[0]]);
        const __m128i kv = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(raw, m4));                     // weights 0..15
        const __m128i hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(raw, 4), m4));  // 16..31
        out[0] = _mm256_mul_ps(i8x8_to_ps(lo), d);
        out[1] = _mm256_mul_ps(i8x8_to_ps(_mm_unpackhi_epi64(lo, lo)), d);
        out[2] = _mm256_mul_ps(i8x8_to_ps(hi), d);
        out[3] = _mm256_mul_ps(i8x8_to_ps(_mm_unpackhi_epi64(hi, hi)), d);
    }
};

}  // namespace AGENTKV_ISA
}  // namespace agentkv
