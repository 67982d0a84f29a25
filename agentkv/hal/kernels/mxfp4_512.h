// MXFP4 for the AVX-512 build (mxfp4.h has the layout and the AVX2 decoder). Include only
// from qmatmul512.cpp, under its target pragma, after mxfp4.h.
//
// A block's 16 possible weights are one zmm table, KV[j] * scale (each product exact, so the
// same bits as the AVX2 decoder and gguf-py), and vpermps looks the codes up: it reads only
// an index's low 4 bits, so the low nibbles need no mask. The scale is a power of two, so the
// table is KV with the scale's exponent added (one broadcast load from E8M0_EXP, one integer
// add) wherever that gives every product as a normal f32, else KV times E8M0_HALF (mxfp4.h);
// no span of scales is converted ahead (that scalar pass cost a fifth of W4_0's decode).
#pragma once

#include "mxfp4.h"

namespace agentkv {
inline namespace AGENTKV_ISA {
namespace formats512 {

// The scales whose products with every E2M1 value (|KV| in 1 .. 12, exponents 0 .. 3) are
// normal f32s, and (e - 128) << 23 for each: the exponent to add.
constexpr unsigned E8M0_EXP_FIRST = 2, E8M0_EXP_LAST = 252;
struct E8M0Exponents {
    int32_t v[256];
};
static constexpr E8M0Exponents make_e8m0_exponents() {
    E8M0Exponents t{};
    for (int e = 0; e < 256; ++e)
        t.v[e] = static_cast<int32_t>(static_cast<uint32_t>(e - 128) << 23);
    return t;
}
static constexpr E8M0Exponents E8M0_EXP = make_e8m0_exponents();

struct WMXFP4 {
    static constexpr int QK = 32, BYTES = 17, UNIT = 1;
    struct Ctx {
        __m512 lut;
    };
    static inline void lookup_codes(const uint8_t* qs, const __m512 lut, __m512 out[2]) {
        const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
        out[0] = _mm512_permutexvar_ps(a, lut);                        // weights 0..15: low nibbles
        out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), lut);  // 16..31: high nibbles
    }
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        const __m512 kv = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f, 0.f, -1.f, -2.f, -3.f, -4.f, -6.f,
                                         -8.f, -12.f);
        const unsigned e = b[0];
        if (__builtin_expect(e - E8M0_EXP_FIRST <= E8M0_EXP_LAST - E8M0_EXP_FIRST, 1)) {
            // kv * 2^(e - 128) by adding e - 128 to the exponents of kv's nonzero lanes, lanes 0
            // and 8 (the +0s) zeroed by the mask: the multiply's bits wherever every product is
            // a normal f32, and an integer add leaves the fma ports to the weights.
            ctx.lut = _mm512_castsi512_ps(
                _mm512_maskz_add_epi32(0xFEFE, _mm512_castps_si512(kv), _mm512_set1_epi32(E8M0_EXP.v[e])));
        } else {
            ctx.lut = _mm512_mul_ps(_mm512_set1_ps(E8M0_HALF.v[e]), kv);
        }
    }
    static inline void decode(const uint8_t* b, int, const Ctx& ctx, __m512 out[2]) { lookup_codes(b + 1, ctx.lut, out); }
};

}  // namespace formats512
}  // namespace AGENTKV_ISA
}  // namespace agentkv
