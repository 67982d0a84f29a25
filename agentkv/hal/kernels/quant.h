// GGUF block decoders: one struct per quant format, each turning 32 weights of a block
// into 4 x 8 f32 lanes in registers.
//
// The arithmetic is gguf-py's, in f32 and in its order (scale * q, then + min or - d*min,
// never fused), so `dequantize` here equals `gguf.quants.dequantize` bit for bit.
//
// A format has QK weights per block of BYTES bytes; `decode(block, sub, out)` yields the
// sub-th run of 32 weights (sub < QK / 32) in row order.
#pragma once

#include "simd.h"

namespace agentkv {
inline namespace AGENTKV_ISA {

enum QType : int {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
    I4G32 = 1004, I8G32 = 1008, F8G32 = 1016  // agentkv's own group-32 blocks (formats/quants/group32.py)
};

struct FmtQ8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b));
        for (int i = 0; i < 4; ++i) {
            __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
            out[i] = _mm256_mul_ps(i8x8_to_ps(q), d);
        }
    }
};

// Weights 0..7 | 8..15 are the low nibbles of bytes 0..7 | 8..15, weights 16..23 | 24..31
// their high nibbles: widen 8 bytes to 8 dwords straight from memory, then mask or shift.
static inline void nibbles32(const uint8_t* qs, __m256 out[4]) {
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const __m256i m = _mm256_set1_epi32(0x0F);
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, m));
    out[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, m));
    out[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    out[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

// Two adjacent f16 values (scale, min) converted in one instruction.
static inline __m128 fp16x2_to_f32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

struct FmtQ4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b));
        const __m256 eight = _mm256_set1_ps(8.0f);
        nibbles32(b + 2, out);
        // q - 8 is exact in f32, so subtracting after the conversion equals gguf's int8 q - 8
        for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(d, _mm256_sub_ps(out[i], eight));
    }
};

struct FmtQ4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m128 dm = fp16x2_to_f32(b);
        const __m256 d = _mm256_broadcastss_ps(dm);
        const __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        nibbles32(b + 4, out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_add_ps(_mm256_mul_ps(d, out[i]), m);
    }
};

// Q5_0 / Q5_1: 32 five-bit q in weight order, one per byte. Weight i's low four bits are the
// low nibble of qs[i] (i < 16) or the high nibble of qs[i - 16]; its fifth bit is bit i of
// the little-endian u32 qh, spread to bytes by a shuffle (byte i <- qh byte i/8) and a compare
// against a mask that has every bit set but bit i%8.
// Q5_0 wants q - 16 in int8, which is lo when the fifth bit is set and lo - 16 = lo | 0xF0 when
// it is clear (kSigned); Q5_1 wants q = lo | 0x10 * bit.
template <bool kSigned>
static inline __m256i five_bit_bytes(const uint8_t* qh, const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i low = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                                                _mm_and_si128(_mm_srli_epi16(raw, 4), m4), 1);
    uint32_t h32;
    std::memcpy(&h32, qh, 4);
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                              0x0303030303030303LL);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h32)), spread);
    bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
    if (kSigned) return _mm256_or_si256(low, _mm256_andnot_si256(bits, _mm256_set1_epi8(static_cast<char>(0xF0))));
    return _mm256_or_si256(low, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
}

// Layout: d f16, qh[4], qs[16]; w = d * (q - 16), q - 16 taken in int8 as gguf-py does (exact).
struct FmtQ5_0 {
    static constexpr int QK = 32, BYTES = 22;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b));
        const __m256i q = five_bit_bytes<true>(b + 2, b + 6);  // q - 16
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        out[0] = _mm256_mul_ps(d, i8x8_to_ps(lo));
        out[1] = _mm256_mul_ps(d, i8x8_to_ps(_mm_unpackhi_epi64(lo, lo)));
        out[2] = _mm256_mul_ps(d, i8x8_to_ps(hi));
        out[3] = _mm256_mul_ps(d, i8x8_to_ps(_mm_unpackhi_epi64(hi, hi)));
    }
};

// Layout: d f16, m f16, qh[4], qs[16]; w = d * q + m.
struct FmtQ5_1 {
    static constexpr int QK = 32, BYTES = 24;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m128 dm = fp16x2_to_f32(b);
        const __m256 d = _mm256_broadcastss_ps(dm);
        const __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        u8x32_to_ps(five_bit_bytes<false>(b + 4, b + 8), out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_add_ps(_mm256_mul_ps(d, out[i]), m);
    }
};

// 6-bit scale and min of sub-block j from the 12 packed bytes of Q4_K / Q5_K.
static inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// All eight of a Q4_K/Q5_K block's scales and mins at once (scale_min_k4's values): bytes 0..7
// the scales, 8..15 the mins. Sub-blocks 0..3 keep 6 bits of bytes 0..3 / 4..7; 4..7 take a
// nibble of bytes 8..11 and the top 2 bits of 0..7 (four lanes per 32-bit word).
static inline __m128i scale_min_k4_bytes(const uint8_t* s) {
    uint32_t u[3];
    std::memcpy(u, s, 12);
    const uint32_t low6 = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, top2 = 0x03030303u;
    const uint32_t sc_lo = u[0] & low6, mn_lo = u[1] & low6;
    const uint32_t sc_hi = (u[2] & nib) | (((u[0] >> 6) & top2) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & nib) | (((u[1] >> 6) & top2) << 4);
    return _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), static_cast<int>(mn_lo),
                          static_cast<int>(mn_hi));
}

// Layout: d f16, dmin f16, scales[12], qs[128]; sub-blocks 2c and 2c+1 are the low and high
// nibbles of qs[32c .. 32c+32).
struct FmtQ4_K {
    static constexpr int QK = 256, BYTES = 144;
    static inline void decode(const uint8_t* b, int sub, __m256 out[4]) {
        int sc, mn;
        scale_min_k4(b + 4, sub, sc, mn);
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b) * static_cast<float>(sc));
        const __m256 dm = _mm256_set1_ps(fp16_to_f32(b + 2) * static_cast<float>(mn));
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (sub >> 1)));
        q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (sub & 1))),
                             _mm256_set1_epi8(0x0F));
        u8x32_to_ps(q, out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_sub_ps(_mm256_mul_ps(d, out[i]), dm);
    }
};

// Layout: d, dmin, scales[12], qh[32], qs[128]; bit `sub` of qh[l] is the fifth bit.
struct FmtQ5_K {
    static constexpr int QK = 256, BYTES = 176;
    static inline void decode(const uint8_t* b, int sub, __m256 out[4]) {
        int sc, mn;
        scale_min_k4(b + 4, sub, sc, mn);
        const __m256 d = _mm256_set1_ps(fp16_to_f32(b) * static_cast<float>(sc));
        const __m256 dm = _mm256_set1_ps(fp16_to_f32(b + 2) * static_cast<float>(mn));
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * (sub >> 1)));
        q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (sub & 1))),
                             _mm256_set1_epi8(0x0F));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << sub));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        u8x32_to_ps(q, out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_sub_ps(_mm256_mul_ps(d, out[i]), dm);
    }
};

// Layout: ql[128], qh[64], scales int8[16], d f16. Sub-block g = 4h + t of half h takes
// ql[64h + 32(t&1) ..] shifted by 4(t>>1), and bits 2t..2t+1 of qh[32h ..]; minus 32.
// Each 16 weights have their own scale.
struct FmtQ6_K {
    static constexpr int QK = 256, BYTES = 210;
    static inline void decode(const uint8_t* b, int sub, __m256 out[4]) {
        const int h = sub >> 2, t = sub & 3;
        const float d = fp16_to_f32(b + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (t & 1)));
        ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t >> 1))),
                              _mm256_set1_epi8(0x0F));
        __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
        __m256i q = _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[2 * sub]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[2 * sub + 1]));
        out[0] = _mm256_mul_ps(d0, i8x8_to_ps(lo));
        out[1] = _mm256_mul_ps(d0, i8x8_to_ps(_mm_unpackhi_epi64(lo, lo)));
        out[2] = _mm256_mul_ps(d1, i8x8_to_ps(hi));
        out[3] = _mm256_mul_ps(d1, i8x8_to_ps(_mm_unpackhi_epi64(hi, hi)));
    }
};

// f32 weights as a "format" of 32-weight blocks, so matmul_f32 shares the quant driver.
struct FmtF32 {
    static constexpr int QK = 32, BYTES = 128;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const float* w = reinterpret_cast<const float*>(b);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_loadu_ps(w + 8 * i);
    }
};

// 16-bit float weights in 32-weight blocks (64 bytes): exact widening, so they equal
// gguf-py's f16 -> f32 and bf16 -> f32 (bits << 16) and an f32 copy of the tensor.
struct FmtF16 {
    static constexpr int QK = 32, BYTES = 64;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        for (int i = 0; i < 4; ++i)
            out[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i)));
    }
};

struct FmtBF16 {
    static constexpr int QK = 32, BYTES = 64;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        for (int i = 0; i < 4; ++i) {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i)));
            out[i] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        }
    }
};

// agentkv's group-32 blocks: scale f32, zero f32 (none for F8G32), then the codes. Weights
// are (q - zero) * scale, as group32.py computes them: q - zero first (exact), then one
// rounding by the product, never fused.
static inline __m256 f32_at(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_ps(v);
}

struct FmtI4G32 {
    static constexpr int QK = 32, BYTES = 24;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 s = f32_at(b), z = f32_at(b + 4);
        nibbles32(b + 8, out);  // Q4_0's nibble order
        for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(_mm256_sub_ps(out[i], z), s);
    }
};

struct FmtI8G32 {
    static constexpr int QK = 32, BYTES = 40;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 s = f32_at(b), z = f32_at(b + 4);
        u8x32_to_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8)), out);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(_mm256_sub_ps(out[i], z), s);
    }
};

// 8 float8 e4m3fn codes -> f32, equal to group32.py's table: a normal code's exponent and
// mantissa move into f32's fields with the bias raised by 120; exponent 0 is m * 2^-9
// (exact); S.1111.111 is NaN. No f32 denormal is formed, so FTZ/DAZ cannot change a value.
static inline __m256 e4m3x8(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7F));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.0f / 512.0f));
    __m256 r = _mm256_blendv_ps(normal, subnormal, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    const __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    r = _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_castsi256_ps(nan));
    return _mm256_or_ps(r, _mm256_castsi256_ps(sign));
}

struct FmtF8G32 {
    static constexpr int QK = 32, BYTES = 36;
    static inline void decode(const uint8_t* b, int, __m256 out[4]) {
        const __m256 s = f32_at(b);
        for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(e4m3x8(b + 4 + 8 * i), s);
    }
};

}  // namespace AGENTKV_ISA
}  // namespace agentkv
