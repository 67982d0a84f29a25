// int8-activation build of the quantized matmul for AVX2 (a CPU without AVX-512 VNNI, or the
// AVX2 build chosen): qmatmul_vnni.cpp's kernels with its arithmetic, so a row has the same
// bits on either, and the one rounding of the activations both builds use.
//
// Each of the VNNI build's 16 f32 lanes is lane l % 8 of half l / 8 here (two 8-lane
// registers; half 0 holds the pair's first 32-weight block). Its integer dot product of 4 u8
// codes with 4 s8 activations (vpdpbusd) is vpmaddubsw then vpmaddwd with ones: exact, since
// no two adjacent products leave int16 (codes are below 64, 2 x 63 x 127 < 2^15), except for
// Q8_0, whose s8 weights meet the activations with each weight's sign moved onto its
// activation (|w| <= 128: 2 x 128 x 127 < 2^15), the sum(w x) that the VNNI build reaches as
// init + sum((w + 128) x). Its vpdpwssd is vpmaddwd plus an int32 add. The float steps are the
// VNNI build's, lane by lane, down to fmas that add a zero (a -0 must stay what it was there),
// and the lanes are summed in its reduce4 tree.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "fp16_table.h"
#include "qmatmul_vnni.h"
#include "quant.h"
#include "mxfp4.h"

namespace agentkv {
namespace int8avx2 {
namespace {

constexpr int GROUP_ROWS = 4;      // rows one call of cols<> holds in registers (16 of them)
constexpr int64_t COL_BLOCK = 24;  // columns the row groups of a row chunk take turns on (L1)
constexpr int64_t ROW_CHUNK = 64;  // rows whose quantized activations stay in L2 while columns pass
constexpr int TILE_COLUMNS = 1;    // columns of a tile_cols call (int8_tiles.h; two spill)
constexpr int64_t TILE_ROWS = GROUP_ROWS + 1;  // the fewest rows that take the tiles (int8_tiles.h)

static inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Sums of 4 adjacent u8 codes x s8 activations as int32 lanes (vpdpbusd onto zero); SIGNED:
// s8 codes, their signs moved onto the activations.
template <bool SIGNED>
static inline __m256i dot4(__m256i q, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (SIGNED) return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), ones);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones);
}

// One 32-weight block: codes in k order, its scale and, for formats with a min, the min.
struct Block {
    __m256i q;
    __m256 d, m;
};

// 16 packed bytes -> 32 codes: the low nibbles (weights 0..15), then the high (16..31).
static inline __m256i nibble_codes(const uint8_t* p) {
    const __m256i v = _mm256_broadcastsi128_si256(load16(p));
    return _mm256_and_si256(_mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0), _mm256_set1_epi8(0x0F));
}

// Byte i is 0xFF where bit i of `bits` is set.
static inline __m256i bit_bytes(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// An fp16 scale as 8 lanes: one broadcast load from fp16_table.h's values (exact, as vcvtph2ps).
static inline __m256 half_scale(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm256_broadcast_ss(&FP16_F32[h]);
}

// The formats of qmatmul_vnni.cpp, one block at a time; OFF and ROUND as there (the rounding).
struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34, OFF = 128, ROUND = 0;
    static constexpr bool MIN = false, SIGNED = true;
    static inline Block decode(const uint8_t* b) { return {load32(b + 2), half_scale(b), _mm256_setzero_ps()}; }
};

// 0xFF in the first n bytes (0 <= n <= 16), zero after: cuts a 16-byte load of a short group's
// header fields (the group's header is followed by its codes, so the load stays inside it).
static inline __m128i first_bytes(int n) {
    static const uint8_t edge[32] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                     0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    return load16(edge + 16 - n);
}

// The rows interleaved at load (qmatmul_vnni.cpp's Interleaved: a lane is a block), each of
// its 16 lanes as lane l % 8 of half l / 8; Q8_0's codes stay signed (dot4<true>).
template <int BYTES_, int OFF_, int FIELDS, bool NIBBLES, bool FIFTH = false, bool E8M0 = false>
struct Interleaved {
    static constexpr int QK = 32, BYTES = BYTES_, OFF = OFF_, ROUND = 3;
    static constexpr bool MIN = FIELDS == 2, SIGNED = !NIBBLES;
    static constexpr int HEADER = E8M0 ? 1 : 2 * FIELDS + (FIFTH ? 4 : 0);
    // The 4-bit formats' steps whose vpmaddubsw pair sums (each within 2 x MAX_CODE x 127, as
    // activation codes lie in -127..127) add up in int16 without leaving it: Q4_0/Q4_1 8
    // (30,480), Q5_0 4 (31,496), MXFP4 (doubled E2M1 + 12, at most 24) 4 (24,384).
    static constexpr int MAX_CODE = E8M0 ? 24 : FIFTH ? 31 : 15;
    static constexpr int STEPS16 = 2 * 127 * MAX_CODE * 8 <= 32767 ? 8 : 2 * 127 * MAX_CODE * 4 <= 32767 ? 4 : 1;
    // Q5_0: 16 where half h's codes of step s have their fifth bit (the VNNI build's masks)
    static inline __m256i fifth(const uint8_t* group, int t, int h, int s) {
        uint64_t bits;
        std::memcpy(&bits, group + 2 * FIELDS * t + (t * s) / 2, 8);
        bits >>= (4 * t * s) & 7;
        if (t < 16) bits &= (1ull << (4 * t)) - 1;
        return _mm256_and_si256(bit_bytes(static_cast<uint32_t>(bits >> (32 * h))), _mm256_set1_epi8(16));
    }
    // the blocks of half h in a group of t
    static inline int live(int t, int h) { return t - 8 * h < 0 ? 0 : (t - 8 * h > 8 ? 8 : t - 8 * h); }
    // dword j of half h's lanes (lanes past t zero)
    static inline __m256i dword(const uint8_t* group, int t, int h, int j) {
        const uint8_t* at = group + HEADER * t + 4 * t * j + 32 * h;
        if (t == 16) return load32(at);
        return _mm256_maskload_epi32(reinterpret_cast<const int*>(at), lane_mask(live(t, h)));
    }
    // The codes dword j (j < DWORDS) of half h's lanes holds, as lo and hi: the 4-bit formats'
    // low nibbles (step j) and high nibbles (step j + 4); Q8_0's codes (step j) in lo, hi unused.
    static constexpr int DWORDS = NIBBLES ? 4 : 8;
    struct Codes {
        __m256i lo, hi;
    };
    static inline Codes codes(const uint8_t* group, int t, int h, int j) {
        const __m256i v = dword(group, t, h, j);
        if constexpr (NIBBLES) {
            const __m256i low = _mm256_set1_epi8(0x0F);
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if constexpr (FIFTH) {
                lo = _mm256_add_epi8(lo, fifth(group, t, h, j));
                hi = _mm256_add_epi8(hi, fifth(group, t, h, j + 4));
            }
            if constexpr (E8M0) {
                const __m256i kv = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
                lo = _mm256_shuffle_epi8(kv, lo);
                hi = _mm256_shuffle_epi8(kv, hi);
            }
            return {lo, hi};
        } else {
            return {v, v};
        }
    }
    // step(s, w) for s = 0..7: half h's codes of step s
    template <class Step>
    static inline void steps(const uint8_t* group, int t, int h, Step&& step) {
#pragma GCC unroll 8
        for (int j = 0; j < DWORDS; ++j) {
            const Codes w = codes(group, t, h, j);
            step(j, w.lo);
            if constexpr (NIBBLES) step(j + 4, w.hi);
        }
    }
    // header field f (0: d, 1: m) of half h's lanes
    static inline __m256 field(const uint8_t* group, int t, int h, int f) {
        if constexpr (E8M0) {  // the VNNI build's e8m0_half of the scale bytes
            const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + 8 * h));
            const __m256i e = _mm256_cvtepu8_epi32(t == 16 ? raw : _mm_and_si128(raw, first_bytes(live(t, h))));
            const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
            const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, small));
        }
        const __m128i raw = load16(group + 2 * t * f + 16 * h);  // a short group: within it, then cut
        return _mm256_cvtph_ps(t == 16 ? raw : _mm_and_si128(raw, first_bytes(2 * live(t, h))));
    }
};
using Q4_0X = Interleaved<18, 8, 1, true>;
using Q4_1X = Interleaved<20, 0, 2, true>;
using Q5_0X = Interleaved<22, 16, 1, true, true>;
using Q8_0X = Interleaved<34, 128, 1, false>;
using MXFP4X = Interleaved<17, 12, 0, true, false, true>;

struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18, OFF = 8, ROUND = 0;
    static constexpr bool MIN = false, SIGNED = false;
    static inline Block decode(const uint8_t* b) { return {nibble_codes(b + 2), half_scale(b), _mm256_setzero_ps()}; }
};

struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20, OFF = 0, ROUND = 0;
    static constexpr bool MIN = true, SIGNED = false;
    static inline Block decode(const uint8_t* b) { return {nibble_codes(b + 4), half_scale(b), half_scale(b + 2)}; }
};

struct Q5_0 {
    static constexpr int QK = 32, BYTES = 22, OFF = 16, ROUND = 0;
    static constexpr bool MIN = false, SIGNED = false;
    static inline Block decode(const uint8_t* b) {
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        const __m256i fifth = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(16));
        return {_mm256_add_epi8(nibble_codes(b + 6), fifth), half_scale(b), _mm256_setzero_ps()};
    }
};

// MXFP4: the doubled E2M1 value of each code plus 12 (init folds the -12 back out).
struct MXFP4 {
    static constexpr int QK = 32, BYTES = 17, OFF = 12, ROUND = 0;
    static constexpr bool MIN = false, SIGNED = false;
    static inline Block decode(const uint8_t* b) {
        const __m256i kv = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                            18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        return {_mm256_shuffle_epi8(kv, nibble_codes(b + 1)), _mm256_set1_ps(E8M0_HALF.v[b[0]]), _mm256_setzero_ps()};
    }
};

// A K-quant super-block as qmatmul_vnni.cpp's Super, each 512-bit vector as two halves:
// q[t][i] half i of its q[t], s[p][i] of its s[p]; m its lanes 0..7 (the VNNI build's
// lanes 8..15 are m_zero); off its low 256 bits.
struct Super {
    __m256i q[4][2];
    __m256i s[2][2];
    __m256 d, m, m_zero;
    __m256i off;
};

// The VNNI build's scale_control vpshufb controls, as two 256-bit halves each.
struct Controls {
    __m256i c[2][2];
};
template <class Index>
static Controls scale_controls(Index index, bool high) {
    alignas(32) int8_t c[2][64];
    for (int p = 0; p < 2; ++p)
        for (int j = 0; j < 4; ++j)
            for (int t = 0; t < 8; ++t) {
                const int8_t i = static_cast<int8_t>(index(p, j, t)), zero = static_cast<int8_t>(0x80);
                c[p][16 * j + 2 * t] = high ? zero : i;
                c[p][16 * j + 2 * t + 1] = high ? i : zero;
            }
    Controls out;
    for (int p = 0; p < 2; ++p)
        for (int i = 0; i < 2; ++i) out.c[p][i] = load32(c[p] + 32 * i);
    return out;
}

struct Q4_K {
    static constexpr int QK = 256, BYTES = 144, OFF = 0, ROUND = 2;
    static constexpr bool MIN = true;
    static inline Super decode(const uint8_t* b) {
        static const Controls c = scale_controls([](int p, int j, int t) { return 4 * p + (t >> 2) + 2 * (j >> 1); }, false);
        const __m128i sm = scale_min_k4_bytes(b + 4);  // scales 0..7, mins 0..7
        const __m256i sb = _mm256_broadcastsi128_si256(sm);
        Super w;
        for (int p = 0; p < 2; ++p)
            for (int i = 0; i < 2; ++i) w.s[p][i] = _mm256_shuffle_epi8(sb, c.c[p][i]);
        w.d = _mm256_set1_ps(fp16_to_f32(b));
        const __m256 neg_dmin = _mm256_set1_ps(-fp16_to_f32(b + 2));
        w.m = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
        w.m_zero = _mm256_mul_ps(neg_dmin, _mm256_setzero_ps());
        w.off = _mm256_setzero_si256();
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 2; ++i) {
                const __m256i v = load32(b + 16 + 64 * h + 32 * i);
                w.q[2 * h][i] = _mm256_and_si256(v, low);
                w.q[2 * h + 1][i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
        return w;
    }
};

struct Q6_K {
    static constexpr int QK = 256, BYTES = 210, OFF = 32, ROUND = 1;
    static constexpr bool MIN = false;
    static inline Super decode(const uint8_t* b) {
        static const Controls c = scale_controls([](int p, int j, int t) { return 8 * p + 4 * (t >> 2) + j; }, true);
        const __m256i sc = _mm256_broadcastsi128_si256(load16(b + 192));
        Super w;
        for (int p = 0; p < 2; ++p)
            for (int i = 0; i < 2; ++i) w.s[p][i] = _mm256_srai_epi16(_mm256_shuffle_epi8(sc, c.c[p][i]), 8);
        w.d = _mm256_set1_ps(fp16_to_f32(b + 208));
        w.m = w.m_zero = _mm256_setzero_ps();
        w.off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(load16(b + 192)), 5));
        const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; ++h) {
            const __m256i qh = load32(b + 128 + 32 * h);
            // half 0: weights 0..31 (qh bit pairs 0 and 2), half 1: 32..63 (pairs 1 and 3)
            const __m256i up[2] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2)};
            const __m256i down[2] = {qh, _mm256_srli_epi16(qh, 2)};
            for (int i = 0; i < 2; ++i) {
                const __m256i ql = load32(b + 64 * h + 32 * i);
                w.q[2 * h][i] = _mm256_or_si256(_mm256_and_si256(ql, low), _mm256_and_si256(up[i], top));
                w.q[2 * h + 1][i] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), low), _mm256_and_si256(down[i], top));
            }
        }
        return w;
    }
};

// ---------------------------------------------------------------- the row x column kernel

// The VNNI build's reduce4 (simd512.h) on accumulators held as halves.
static inline __m128 reduce4(const __m256 (&a0)[2], const __m256 (&a1)[2], const __m256 (&a2)[2], const __m256 (&a3)[2]) {
    const auto half = [](const __m256(&v)[2]) { return _mm256_add_ps(v[0], v[1]); };
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(half(a0), half(a1)), _mm256_hadd_ps(half(a2), half(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

template <int M, int G>
static inline void start_columns(const Problem& p, int64_t c0, int64_t stride, __m256 (&acc)[M][G][2],
                                 const uint8_t* (&rows)[G]) {
    for (int r = 0; r < M; ++r)
        for (int g = 0; g < G; ++g) acc[r][g][0] = acc[r][g][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
}

template <int M, int G>
static inline void store_columns(const Problem& p, int64_t c0, int64_t stride, const __m256 (&acc)[M][G][2]) {
    const __m256 z[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int r = 0; r < M; ++r) {
        alignas(16) float lanes[4];
        _mm_store_ps(lanes, reduce4(acc[r][0], G > 1 ? acc[r][1] : z, G > 2 ? acc[r][2] : z, G > 3 ? acc[r][3] : z));
        for (int g = 0; g < G; ++g) p.out[r * p.n + c0 + g * stride] = lanes[g];
    }
}

// Columns c0 + g * stride of a 32-weight format: the VNNI build's cols, a pair of blocks per step.
template <class F, int M, int G>
static void cols(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m256 acc[M][G][2];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t units = (p.k + 63) / 64;
    const NextInStreams<G> ahead(rows, p.row_bytes, units);
    for (int64_t u = 0; u < units; ++u) {
        const bool single = (u + 1) * 64 > p.k;  // the odd last block: its pair is itself again
        ahead.at(u);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            const uint8_t* a = rows[g] + u * 2 * F::BYTES;
            const Block w[2] = {F::decode(a), F::decode(single ? a : a + F::BYTES)};
#pragma GCC unroll 4
            for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
                for (int i = 0; i < 2; ++i) {
                    const int64_t lane = 16 * u + 8 * i;
                    __m256i dot = dot4<F::SIGNED>(w[i].q, load32(x.q + r * x.ld_q + 4 * lane));
                    if (F::OFF != 0 && !F::SIGNED) dot = _mm256_add_epi32(load32(x.init + r * x.ld_lane + lane), dot);
                    const __m256 s = _mm256_mul_ps(w[i].d, _mm256_loadu_ps(x.dx + r * x.ld_lane + lane));
                    acc[r][g][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[r][g][i]);
                    if (F::MIN)
                        acc[r][g][i] = _mm256_fmadd_ps(w[i].m, _mm256_loadu_ps(x.xs + r * x.ld_lane + lane), acc[r][g][i]);
                }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

template <class F>
constexpr bool NIBBLES_OF = !F::SIGNED;  // the interleaved 4-bit formats (Q8_0's codes are signed)

// Interleaved 32-wide rows: the VNNI build's cols_x16, one half of the 16 block lanes at a time
// (a last group of at most 8 blocks: the first half only, as the VNNI build's half width).
template <class F, int M, int G>
static void cols_x16(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m256 acc[M][G][2];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t groups = x16_groups(p.k);
    const NextInStreams<G> ahead(rows, p.row_bytes, groups);
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int t = x16_blocks(p.k, gi);
        ahead.at(gi);
        for (int g = 0; g < G; ++g) {
            const uint8_t* group = rows[g] + gi * 16 * F::BYTES;
            // Q8_0 in a decode: a whole group's two halves in one pass over its bytes (the 4-bit
            // formats share one load between two steps instead)
            constexpr int B = M <= 2 ? M : 1;  // rows of such a pass (a placeholder one otherwise)
            __m256i both[B][2];
            const bool together = !NIBBLES_OF<F> && M <= 2 && t > 8;
            if (together) {
                for (int r = 0; r < B; ++r) both[r][0] = both[r][1] = _mm256_setzero_si256();
                F::steps(group, t, 0, [&](int s, __m256i w0) {
                    const __m256i w1 = F::dword(group, t, 1, s);  // Q8_0: dword s is step s
#pragma GCC unroll 2
                    for (int r = 0; r < B; ++r) {
                        const int8_t* xq = x.q + r * x.ld_q + 512 * gi + 64 * s;
                        both[r][0] = _mm256_add_epi32(both[r][0], dot4<F::SIGNED>(w0, load32(xq)));
                        both[r][1] = _mm256_add_epi32(both[r][1], dot4<F::SIGNED>(w1, load32(xq + 32)));
                    }
                });
            }
#pragma GCC unroll 2
            for (int h = 0; h < (t > 8 ? 2 : 1); ++h) {  // a last group of t <= 8: lanes 8..15 untouched
                const int64_t slot = 16 * gi + 8 * h;
                __m256i dot[M];
#pragma GCC unroll 4
                for (int r = 0; r < M; ++r) dot[r] = together ? both[r < B ? r : 0][h] : _mm256_setzero_si256();
                if constexpr (NIBBLES_OF<F>) {
                    // vpmaddubsw's int16 pair sums added in int16 for STEPS16 steps, then widened
                    // once (vpmaddwd): exact, as no partial sum leaves int16 (Interleaved::STEPS16)
                    __m256i pairs[M];
#pragma GCC unroll 4
                    for (int r = 0; r < M; ++r) pairs[r] = _mm256_setzero_si256();
                    int taken = 0;
                    F::steps(group, t, h, [&](int s, __m256i w) {
#pragma GCC unroll 4
                        for (int r = 0; r < M; ++r)
                            pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(w, load32(x.q + r * x.ld_q + 512 * gi + 64 * s + 32 * h)));
                        if (++taken % F::STEPS16 == 0) {
#pragma GCC unroll 4
                            for (int r = 0; r < M; ++r) {
                                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1)));
                                pairs[r] = _mm256_setzero_si256();
                            }
                        }
                    });
                } else if (!together) {
                    F::steps(group, t, h, [&](int s, __m256i w) {
#pragma GCC unroll 4
                        for (int r = 0; r < M; ++r)
                            dot[r] = _mm256_add_epi32(dot[r], dot4<F::SIGNED>(w, load32(x.q + r * x.ld_q + 512 * gi + 64 * s + 32 * h)));
                    });
                }
                const __m256 d = F::field(group, t, h, 0);
#pragma GCC unroll 4
                for (int r = 0; r < M; ++r) {
                    if (F::OFF != 0 && !F::SIGNED) dot[r] = _mm256_add_epi32(load32(x.init + r * x.ld_lane + slot), dot[r]);
                    const __m256 sc = _mm256_mul_ps(d, _mm256_loadu_ps(x.dx + r * x.ld_lane + slot));
                    acc[r][g][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), sc, acc[r][g][h]);
                }
                if (F::MIN) {
                    const __m256 m = F::field(group, t, h, 1);
#pragma GCC unroll 4
                    for (int r = 0; r < M; ++r)
                        acc[r][g][h] = _mm256_fmadd_ps(m, _mm256_loadu_ps(x.xs + r * x.ld_lane + slot), acc[r][g][h]);
                }
            }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

// Columns c0 + g * stride of a Tile's M rows (int8_tiles.h: a prefill): cols_x16's arithmetic
// per output, each half's steps outermost so each decoded dword meets every row, the 4-bit
// formats' pair sums added in int16 for STEPS16 steps; float accumulators in L1 (one load and
// store per half and group). One column a call (TILE_COLUMNS): two spilled the 16 registers.
// AVX2 build on the Zen 4, one thread, 512 rows: SmolLM2's ffn_up 11.8 -> 10.4 ms, attn_q
// 4.5 -> 4.1, ffn_down 7.2 -> 6.7.
template <class F, int M, int G>
static void tile_cols(const Problem& p, const Tile& x, int64_t c0, int64_t stride) {
    alignas(32) float acc[M][G][16];
    for (int r = 0; r < M; ++r)
        for (int g = 0; g < G; ++g)
            for (int h = 0; h < 2; ++h) _mm256_store_ps(acc[r][g] + 8 * h, _mm256_setzero_ps());
    const uint8_t* rows[G];
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
    const int64_t groups = x16_groups(p.k);
    const NextInStreams<G> ahead(rows, p.row_bytes, groups);
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int t = x16_blocks(p.k, gi);
        const int8_t* xq = x.q + 64 * 8 * M * gi;
        const int64_t at = 16 * M * gi;
        const uint8_t* group[G];
        for (int g = 0; g < G; ++g) group[g] = rows[g] + gi * 16 * F::BYTES;
        ahead.at(gi);
        for (int h = 0; h < (t > 8 ? 2 : 1); ++h) {  // a last group of t <= 8: lanes 8..15 untouched
            __m256i dot[M][G];
            if constexpr (NIBBLES_OF<F>) {
                __m256i pairs[M][G];
#pragma GCC unroll 4
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
                    for (int g = 0; g < G; ++g) dot[r][g] = pairs[r][g] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j) {
                    typename F::Codes w[G];
#pragma GCC unroll 2
                    for (int g = 0; g < G; ++g) w[g] = F::codes(group[g], t, h, j);
#pragma GCC unroll 4
                    for (int r = 0; r < M; ++r) {
                        const __m256i lo = load32(xq + 64 * (M * j + r) + 32 * h);
                        const __m256i hi = load32(xq + 64 * (M * (j + 4) + r) + 32 * h);
#pragma GCC unroll 2
                        for (int g = 0; g < G; ++g)
                            pairs[r][g] = _mm256_add_epi16(_mm256_add_epi16(pairs[r][g], _mm256_maddubs_epi16(w[g].lo, lo)),
                                                           _mm256_maddubs_epi16(w[g].hi, hi));
                    }
                    if ((2 * (j + 1)) % F::STEPS16 == 0) {
#pragma GCC unroll 4
                        for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
                            for (int g = 0; g < G; ++g) {
                                dot[r][g] = _mm256_add_epi32(dot[r][g], _mm256_madd_epi16(pairs[r][g], _mm256_set1_epi16(1)));
                                pairs[r][g] = _mm256_setzero_si256();
                            }
                    }
                }
            } else {
#pragma GCC unroll 4
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
                    for (int g = 0; g < G; ++g) dot[r][g] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    __m256i w[G];
#pragma GCC unroll 2
                    for (int g = 0; g < G; ++g) w[g] = F::dword(group[g], t, h, j);
#pragma GCC unroll 4
                    for (int r = 0; r < M; ++r) {
                        const __m256i xv = load32(xq + 64 * (M * j + r) + 32 * h);
#pragma GCC unroll 2
                        for (int g = 0; g < G; ++g) dot[r][g] = _mm256_add_epi32(dot[r][g], dot4<F::SIGNED>(w[g], xv));
                    }
                }
            }
            __m256 d[G], m[G];
            for (int g = 0; g < G; ++g) {
                d[g] = F::field(group[g], t, h, 0);
                if (F::MIN) m[g] = F::field(group[g], t, h, 1);
            }
#pragma GCC unroll 4
            for (int r = 0; r < M; ++r) {
                const int64_t slot = at + 16 * r + 8 * h;
                const __m256 dx = _mm256_load_ps(x.dx + slot);
#pragma GCC unroll 2
                for (int g = 0; g < G; ++g) {
                    __m256i sum = dot[r][g];
                    if (F::OFF != 0 && !F::SIGNED) sum = _mm256_add_epi32(load32(x.init + slot), sum);
                    __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d[g], dx), _mm256_load_ps(acc[r][g] + 8 * h));
                    if (F::MIN) a = _mm256_fmadd_ps(m[g], _mm256_load_ps(x.xs + slot), a);
                    _mm256_store_ps(acc[r][g] + 8 * h, a);
                }
            }
        }
    }
    // four accumulators per reduce4 (each lane's tree reads only its own accumulator)
    constexpr int SUMS = M * G;
    for (int i = 0; i < SUMS; i += 4) {
        __m256 a[4][2];
        for (int u = 0; u < 4; ++u)
            for (int h = 0; h < 2; ++h)
                a[u][h] = i + u < SUMS ? _mm256_load_ps(acc[(i + u) / G][(i + u) % G] + 8 * h) : _mm256_setzero_ps();
        alignas(16) float lanes[4];
        _mm_store_ps(lanes, reduce4(a[0], a[1], a[2], a[3]));
        for (int u = 0; u < 4 && i + u < SUMS; ++u) p.out[((i + u) / G) * p.n + c0 + ((i + u) % G) * stride] = lanes[u];
    }
}

// The K-quants' columns: the VNNI build's cols_super.
template <class F, int M, int G>
static void cols_super(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m256 acc[M][G][2];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t units = p.k / F::QK;
    const NextInStreams<G> ahead(rows, p.row_bytes, units);
    for (int64_t u = 0; u < units; ++u) {
        ahead.at(u);
        for (int g = 0; g < G; ++g) {
            const Super w = F::decode(rows[g] + u * F::BYTES);
#pragma GCC unroll 4
            for (int r = 0; r < M; ++r) {
                const int8_t* xq = x.q + r * x.ld_q + F::QK * u;
                __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                if (F::OFF != 0) sum[0] = _mm256_madd_epi16(w.off, load32(x.gsum + 2 * r * x.ld_sub + 16 * u));
#pragma GCC unroll 2
                for (int pk = 0; pk < 2; ++pk)
#pragma GCC unroll 2
                    for (int i = 0; i < 2; ++i) {
                        const __m256i d0 = dot4<false>(w.q[2 * pk][i], load32(xq + 128 * pk + 32 * i));
                        const __m256i d1 = dot4<false>(w.q[2 * pk + 1][i], load32(xq + 128 * pk + 64 + 32 * i));
                        sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(_mm256_packs_epi32(d0, d1), w.s[pk][i]));
                    }
                const __m256 s = _mm256_mul_ps(w.d, _mm256_set1_ps(x.dx[r * x.ld_lane + F::QK / 4 * u]));
                for (int i = 0; i < 2; ++i) acc[r][g][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i]), s, acc[r][g][i]);
                if (F::MIN) {
                    acc[r][g][0] = _mm256_fmadd_ps(w.m, _mm256_loadu_ps(x.sub + r * x.ld_sub + 8 * u), acc[r][g][0]);
                    acc[r][g][1] = _mm256_fmadd_ps(w.m_zero, _mm256_setzero_ps(), acc[r][g][1]);
                }
            }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

#include "int8_sweep.h"
#include "int8_tiles.h"

// One group of <= GROUP_ROWS rows: four weight streams for one row (the prefetchers' best),
// else as many columns as the 16 registers hold with the rows' accumulators.
template <class F>
static void group(const Problem& p, const QuantRows& x, int64_t c0, int64_t c1) {
    switch (p.m) {
        case 1: cols_range<F, 1, 4>(p, x, c0, c1); break;
        case 2: cols_range<F, 2, F::QK == 256 ? 1 : 2>(p, x, c0, c1); break;
        case 3: cols_range<F, 3, 1>(p, x, c0, c1); break;
        default: cols_range<F, 4, 1>(p, x, c0, c1); break;
    }
}

}  // namespace

void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1) {
    dispatch(qtype, [&](auto fmt) { rows_range<decltype(fmt)>(p, x, c0, c1); });
}

TileFns tile_fns() { return {tiles_used_of, tiles_bytes_of, tile_chunks_of, pack_tiles_of, tiled_columns_of}; }

}  // namespace int8avx2

namespace int8 {
bool qtype_supported(int qtype) {
    return int8avx2::dispatch(qtype, [](auto) {});
}

// The key: the code offset times 4 plus ROUND (0: 32-wide blocks in k order, 1: 256-wide in
// k order, 2: 256-wide in Q4_K's order).
int rounding_of(int qtype) {
    int key = -1;
    int8avx2::dispatch(qtype, [&](auto fmt) { key = 4 * decltype(fmt)::OFF + decltype(fmt)::ROUND; });
    return key;
}
}  // namespace int8
}  // namespace agentkv
