// The AVX2 matmul's own decoders (qmatmul.cpp), where they differ from quant.h's gguf-exact
// ones (which `dequantize` keeps): each weight still has one fixed value that the decode and
// the prefill path both use, but it may be rounded differently from gguf-py's (the oracle
// tests bound the difference) — the AVX-512 build's tables do the same.
//
// A TABLED format (Q8_0) splits a block's decode in two: `scalars` converts the block's fp16
// scale to f32 into a small array, ahead of the block's use, SPAN blocks at a time; then
// `lookup` decodes the weights with the scale broadcast straight from that array (a load,
// not a shuffle). `decode` = both, for the prefill panel: the same values, bit for bit.
// Q4_0 and Q4_1 read their scales through fp16_table.h instead, with no pass ahead.
// Include only from qmatmul.cpp, after quant.h.
#pragma once

#include "fp16_table.h"
#include "quant.h"

namespace agentkv {
inline namespace AGENTKV_ISA {
namespace formats_avx2 {

// Q4_1: fma(d, q, m), rounded once (gguf-py: d * q, then + m). The AVX-512 table's values.
// Its scales come through FP16_F32 (fp16_table.h): two broadcast loads, no conversion.
struct MQ4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(fp16_at(b)), m = _mm256_set1_ps(fp16_at(b + 2));
        nibbles32(b + 4, out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_fmadd_ps(d, out[i], m);
    }
};

// Q4_0: fma(d, q, -8 d): -8 d is exact and the fma rounds the exact d * (q - 8) once, which
// is gguf-py's (q - 8) * d bit for bit, in one instruction instead of a sub and a mul.
struct MQ4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(fp16_at(b)), m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        nibbles32(b + 2, out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_fmadd_ps(d, out[i], m);
    }
};

// Q8_0: q * d as gguf-py; only the scale's conversion moves ahead (scalars).
struct MQ8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static constexpr bool TABLED = true;
    static inline void scalars(const uint8_t* b, float* s) { s[0] = fp16_to_f32(b); }
    static inline void lookup(const uint8_t* b, const float* s, __m256 out[4]) {
        const __m256 d = _mm256_broadcast_ss(s);
        for (int i = 0; i < 4; ++i)
            out[i] = _mm256_mul_ps(i8x8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i))), d);
    }
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        float s[2];
        scalars(b, s);
        lookup(b, s, out);
    }
};

// A PREPARED format works out what a 256-weight block's sub-blocks share once per block
// (`prepare` into a Ctx: the sub-block scales), then `decode(block, sub, ctx, out)` per
// sub-block; the two-argument `decode` does both (the same values).
//
// Q4_K: fmsub(d * sc, q, dmin * mn), rounded once (gguf-py: d * sc * q, then - dmin * mn) —
// the AVX-512 build's table values.
struct MQ4_K {
    static constexpr int QK = 256, BYTES = 144;
    struct Ctx {
        alignas(32) float d[8];  // d * scale_j
        alignas(32) float dm[8];  // dmin * min_j
    };
    // The 16 products in two multiplies: the scalar loop's values (each one IEEE product).
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        const __m128i bytes = scale_min_k4_bytes(b + 4);
        _mm256_store_ps(ctx.d, _mm256_mul_ps(_mm256_set1_ps(fp16_to_f32(b)), u8x8_to_ps(bytes)));
        const __m256 mins = u8x8_to_ps(_mm_unpackhi_epi64(bytes, bytes));
        _mm256_store_ps(ctx.dm, _mm256_mul_ps(_mm256_set1_ps(fp16_to_f32(b + 2)), mins));
    }
    static inline void decode(const uint8_t* b, int sub, const Ctx& ctx, __m256 out[4]) {
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (sub >> 1)));
        q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (sub & 1))), _mm256_set1_epi8(0x0F));
        u8x32_to_ps(q, out);
        const __m256 d = _mm256_broadcast_ss(ctx.d + sub), dm = _mm256_broadcast_ss(ctx.dm + sub);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_fmsub_ps(d, out[i], dm);
    }
    static inline void decode(const uint8_t* b, int sub, __m256 out[4]) {
        Ctx ctx;
        prepare(b, ctx);
        decode(b, sub, ctx, out);
    }
};

// Q6_K: gguf-py's values (d * sc, then * q); only the 16 sub-block scales move to `prepare`.
struct MQ6_K {
    static constexpr int QK = 256, BYTES = 210;
    struct Ctx {
        alignas(32) float d[16];  // d * scale_j
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b + 208));
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
        _mm256_store_ps(ctx.d, _mm256_mul_ps(d, i8x8_to_ps(sc)));
        _mm256_store_ps(ctx.d + 8, _mm256_mul_ps(d, i8x8_to_ps(_mm_unpackhi_epi64(sc, sc))));
    }
    static inline void decode(const uint8_t* b, int sub, const Ctx& ctx, __m256 out[4]) {
        const int h = sub >> 2, t = sub & 3;
        __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (t & 1)));
        ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t >> 1))), _mm256_set1_epi8(0x0F));
        __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(ql, _mm256_slli_epi16(qh, 4)), _mm256_set1_epi8(32));
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m256 d0 = _mm256_broadcast_ss(ctx.d + 2 * sub), d1 = _mm256_broadcast_ss(ctx.d + 2 * sub + 1);
        out[0] = _mm256_mul_ps(d0, i8x8_to_ps(lo));
        out[1] = _mm256_mul_ps(d0, i8x8_to_ps(_mm_unpackhi_epi64(lo, lo)));
        out[2] = _mm256_mul_ps(d1, i8x8_to_ps(hi));
        out[3] = _mm256_mul_ps(d1, i8x8_to_ps(_mm_unpackhi_epi64(hi, hi)));
    }
    static inline void decode(const uint8_t* b, int sub, __m256 out[4]) {
        Ctx ctx;
        prepare(b, ctx);
        decode(b, sub, ctx, out);
    }
};

// The matmul's decoder of a quant.h format: its own where one is above, else the same.
template <class F>
struct Matmul {
    using type = F;
};
template <>
struct Matmul<FmtQ4_1> {
    using type = MQ4_1;
};
template <>
struct Matmul<FmtQ4_0> {
    using type = MQ4_0;
};
template <>
struct Matmul<FmtQ8_0> {
    using type = MQ8_0;
};

template <>
struct Matmul<FmtQ4_K> {
    using type = MQ4_K;
};
template <>
struct Matmul<FmtQ6_K> {
    using type = MQ6_K;
};

template <class F, class = void>
struct is_prepared {
    static constexpr bool value = false;
};
template <class F>
struct is_prepared<F, decltype(void(sizeof(typename F::Ctx)))> {
    static constexpr bool value = true;
};

template <class F, class = void>
struct is_tabled {
    static constexpr bool value = false;
};
template <class F>
struct is_tabled<F, decltype(void(F::TABLED))> {
    static constexpr bool value = F::TABLED;
};

}  // namespace formats_avx2
}  // namespace AGENTKV_ISA
}  // namespace agentkv
