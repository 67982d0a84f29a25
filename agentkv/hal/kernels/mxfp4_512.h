// MXFP4 for the AVX-512 build (mxfp4.h has the layout and the AVX2 decoder). Include only
// from qmatmul512.cpp, under its target pragma, after mxfp4.h.
//
// A block's 16 possible weights are one zmm table, KV[j] * scale (each product exact, so the
// same bits as the AVX2 decoder and gguf-py), and vpermps looks the codes up: it reads only
// an index's low 4 bits, so the low nibbles need no mask. The scale is one load from
// E8M0_HALF (mxfp4.h) folded into the table's broadcast multiply, so unlike W4_0 this format
// needs no span of scales converted ahead (that scalar pass cost a fifth of its decode).
#pragma once

#include "mxfp4.h"

namespace agentkv {
inline namespace AGENTKV_ISA {
namespace formats512 {

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
        ctx.lut = _mm512_mul_ps(_mm512_set1_ps(E8M0_HALF.v[b[0]]), kv);
    }
    static inline void decode(const uint8_t* b, int, const Ctx& ctx, __m512 out[2]) { lookup_codes(b + 1, ctx.lut, out); }
};

}  // namespace formats512
}  // namespace AGENTKV_ISA
}  // namespace agentkv
