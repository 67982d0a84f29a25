// int8-activation build of the quantized matmul (AVX-512 VNNI): the activations are rounded
// to int8 per row and per 32-wide block (one f32 scale each, as llama.cpp's q8_0; per 256 for
// the K-quants, as its q8_K), and each weight block meets them in integer dot products
// (vpdpbusd: u8 weights x s8 activations, exact int32 sums); only the per-block (K-quants:
// per-super-block) scaling is floating point.
//
// Compiled for avx512f/bw/vl/dq/vnni by the pragma below whatever the global flags are, and
// only called after cpu_supports() said yes (qmatmul.cpp checks it when the mode is chosen).
// The headers come in under their own inline namespace (AGENTKV_ISA) and no std:: code is
// built under the pragma, as in qmatmul512.cpp (tests/hal checks the object for weak symbols).
//
// The one order of this build, for output (r, c), with k cut into 64-wide pairs of blocks:
//   acc = 0 (16 f32 lanes; lane l covers k elements 4l .. 4l + 4 of the pair)
//   for each pair in order:
//     I   = init[r] + dpbusd(wq[c], xq[r])      (int32 lanes, exact; init = -OFF * 4-sums of xq)
//     acc = fma(float(I), dw[c] * dx[r], acc)   (dw: the weight block's scale per lane)
//     acc = fma(mw[c], xs[r], acc)              (only formats with a min: Q4_1)
//   out = the sum of acc through simd512.h's reduce4
// and for Q4_K and Q6_K, per super-block, as cols_super says.
// A row's quantized values depend on that row alone, and the column loop never changes an
// output's sequence, so a row has the same bits at any row count, in any group, on any thread.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qmatmul_vnni.h"

namespace agentkv {
namespace vnni {
// The AVX-512 build's own check (qmatmul512.cpp), plus VNNI.
bool cpu_supports() { return avx512::cpu_supports() && __builtin_cpu_supports("avx512vnni"); }
}  // namespace vnni
}  // namespace agentkv

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#define AGENTKV_ISA isa_vnni
#include "quant.h"
#include "simd512.h"
#include "mxfp4.h"

namespace agentkv {
namespace vnni {
namespace {

constexpr int GROUP_ROWS = 8;      // rows one call of cols<> holds in registers
constexpr int64_t COL_BLOCK = 24;  // columns the row groups of a row chunk take turns on (L1)
constexpr int64_t ROW_CHUNK = 64;  // rows whose quantized activations stay in L2 while columns pass
constexpr int TILE_COLUMNS = 2;    // columns of a tile_cols call (int8_tiles.h)
// The fewest rows that take the tiles (int8_tiles.h) rather than cols_x16: from 4, a decode of
// several sequences is bound by cols_x16's activation loads (each column reloads every row's),
// which the tiles load once for all of a call's columns. SmolLM2's layer weights in turn, two
// threads, separate processes alternating (tiles / cols_x16): 4 rows 6.0-7.8 / 6.6-9.6 ms,
// 5 rows 6.1-6.4 / 6.4-7.1, 6 rows 7.0-8.8 / 7.7-9.3, 8 rows 8.4-8.9 / 9.5-11.0; 2 rows 4.7-6.5
// / 3.3-5.7 and 3 rows 5.4-5.8 / 4.5-6.6, so those stay on cols_x16.
constexpr int64_t TILE_ROWS = 4;

// One pair of 32-weight blocks, ready for the dot products: u8 codes in k order, the scale of
// each lane's block (or 16-weight group) and, for formats with a min, the min per lane.
struct Pair {
    __m512i q;
    __m512 d, m;
};

static inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The 16 packed bytes at a and at b -> 64 codes in k order: a's low nibbles (its weights
// 0..15), a's high nibbles (16..31), then b's. The 128-bit lanes [a, a, b, b] come straight
// from two broadcast loads (the second merged into lanes 2, 3), so the only shuffle left is
// the caller's table lookup; lanes 1 and 3 are shifted to their high nibbles.
static inline __m512i nibble_codes(const uint8_t* a, const uint8_t* b) {
    const __m512i aa = _mm512_broadcast_i32x4(load16(a));
    const __m512i ab = _mm512_mask_broadcast_i32x4(aa, static_cast<__mmask16>(0xFF00), load16(b));
    const __m512i hi = _mm512_mask_srli_epi16(ab, static_cast<__mmask32>(0xFF00FF00u), ab, 4);
    return _mm512_and_si512(hi, _mm512_set1_epi8(0x0F));
}

// f16 values -> f32 lanes: v holds up to 8 halves; lane i of the result is half idx[i].
static inline __m512 f16_lanes(uint64_t v, __m512i idx) {
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(v)))));
}

static inline uint64_t half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}

static inline uint64_t pair_at(const uint8_t* p) {
    uint32_t h;
    std::memcpy(&h, p, 4);
    return h;
}

// Lanes 0..7 take half 0, lanes 8..15 half 1 (and + 2: halves 2 and 3).
static inline __m512i split_index(int first, int second) {
    return _mm512_mask_blend_epi32(static_cast<__mmask16>(0xFF00), _mm512_set1_epi32(first), _mm512_set1_epi32(second));
}

// The f16 scales at a and b, as lanes 0..7 and 8..15.
static inline __m512 scales(const uint8_t* a, const uint8_t* b) {
    return f16_lanes(half_at(a) | (half_at(b) << 16), split_index(0, 1));
}

static inline __m512i join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// Formats of 32-weight blocks: a unit is two blocks (a and b; b == a for the odd last block,
// whose activations are zero-padded so it adds nothing).
struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34, UNIT_K = 64, PAIRS = 1, OFF = 128, ROUND = 0;
    static constexpr bool MIN = false;
    struct Ctx {};
    static inline void prepare(const uint8_t*, const uint8_t*, Ctx&) {}
    static inline Pair decode(const uint8_t* a, const uint8_t* b, int, const Ctx&) {
        // s8 codes + 128 as u8: the dot product is then sum((w + 128) x) = sum(w x) + 128 sum(x)
        const __m512i w = join(load32(a + 2), load32(b + 2));
        return {_mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))), scales(a, b), _mm512_setzero_ps()};
    }
};

struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18, UNIT_K = 64, PAIRS = 1, OFF = 8, ROUND = 0;
    static constexpr bool MIN = false;
    struct Ctx {};
    static inline void prepare(const uint8_t*, const uint8_t*, Ctx&) {}
    static inline Pair decode(const uint8_t* a, const uint8_t* b, int, const Ctx&) {
        return {nibble_codes(a + 2, b + 2), scales(a, b), _mm512_setzero_ps()};
    }
};

struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20, UNIT_K = 64, PAIRS = 1, OFF = 0, ROUND = 0;
    static constexpr bool MIN = true;
    struct Ctx {};
    static inline void prepare(const uint8_t*, const uint8_t*, Ctx&) {}
    static inline Pair decode(const uint8_t* a, const uint8_t* b, int, const Ctx&) {
        const uint64_t dm = pair_at(a) | (pair_at(b) << 32);  // d_a, m_a, d_b, m_b
        return {nibble_codes(a + 4, b + 4), f16_lanes(dm, split_index(0, 2)),
                f16_lanes(dm, split_index(1, 3))};
    }
};

// Weight i's fifth bit is bit i of the block's little-endian u32 qh: one 64-bit byte mask.
struct Q5_0 {
    static constexpr int QK = 32, BYTES = 22, UNIT_K = 64, PAIRS = 1, OFF = 16, ROUND = 0;
    static constexpr bool MIN = false;
    struct Ctx {};
    static inline void prepare(const uint8_t*, const uint8_t*, Ctx&) {}
    static inline Pair decode(const uint8_t* a, const uint8_t* b, int, const Ctx&) {
        uint32_t ha, hb;
        std::memcpy(&ha, a + 2, 4);
        std::memcpy(&hb, b + 2, 4);
        const __mmask64 fifth = static_cast<__mmask64>(ha) | (static_cast<__mmask64>(hb) << 32);
        const __m512i low = nibble_codes(a + 6, b + 6);
        return {_mm512_mask_add_epi8(low, fifth, low, _mm512_set1_epi8(16)), scales(a, b), _mm512_setzero_ps()};
    }
};

// What the interleaved kernels do at either width (16 lanes in a zmm, or the half-width last
// group's 8 in a ymm): masked dword loads, a 4-bit code's nibbles, Q8_0's codes + 128, +16 on
// the bytes a mask marks (Q5_0's fifth bits), and a 16-entry byte table lookup.
static inline __m512i lane_dwords(__mmask16 m, const uint8_t* p) { return _mm512_maskz_loadu_epi32(m, p); }
static inline __m256i lane_dwords(__mmask8 m, const uint8_t* p) { return _mm256_maskz_loadu_epi32(m, p); }
static inline __m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
static inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline __m512i high_nibbles(__m512i v) { return low_nibbles(_mm512_srli_epi16(v, 4)); }
static inline __m256i high_nibbles(__m256i v) { return low_nibbles(_mm256_srli_epi16(v, 4)); }
static inline __m512i plus_128(__m512i v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
static inline __m256i plus_128(__m256i v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
static inline __m512i add16(__m512i v, uint64_t marked) {
    return _mm512_mask_add_epi8(v, static_cast<__mmask64>(marked), v, _mm512_set1_epi8(16));
}
static inline __m256i add16(__m256i v, uint64_t marked) {
    return _mm256_mask_add_epi8(v, static_cast<__mmask32>(marked), v, _mm256_set1_epi8(16));
}
static inline __m512i lookup16(__m128i table, __m512i v) { return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), v); }
static inline __m256i lookup16(__m128i table, __m256i v) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), v);
}
// MXFP4's codes as the doubled E2M1 value plus 12
static inline __m128i e2m1_plus_12() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }

// The 32-wide formats with their rows interleaved at load (qmatmul.cpp's interleave_rows,
// qtypes Q4_0X, Q4_1X, Q5_0X, Q8_0X, MXFP4X): per group of 16 blocks (t < 16 for a row's last group), each
// f16 header field of the t blocks (d; Q4_1: d, then m), then the t blocks' code bytes a dword
// at a time (dword j of every block, then j + 1). So a lane is a block: eight vpdpbusd give
// each lane its block's whole integer sum (Q8_0: dwords j = steps j, codes 4j .. 4j + 3; the
// 4-bit formats: dword j's low nibbles are step j, its high nibbles step j + 4), and one float
// step serves 16 blocks where the pairs above spend one per 64 weights.
//
// Q5_0's fifth bits come after its d fields as eight step masks, a bit per code (step s: 4t
// bits, bit 4l + b is weight 4s + b of block l; mask s starts at bit 4ts), which add 16 to the
// codes they mark.
//
// MXFP4 (E8M0) has one scale byte per block for a header, and its codes become the doubled
// E2M1 value plus 12 (one vpshufb, as MXFP4 above; init folds the 12 out).
template <int BYTES_, int OFF_, int FIELDS, bool NIBBLES, bool FIFTH = false, bool E8M0 = false>
struct Interleaved {
    static constexpr int QK = 32, BYTES = BYTES_, OFF = OFF_, ROUND = 3;
    static constexpr bool MIN = FIELDS == 2;
    static constexpr int HEADER = E8M0 ? 1 : 2 * FIELDS + (FIFTH ? 4 : 0);  // header bytes per block
    // step s's fifth-bit mask: 4t bits
    static inline uint64_t fifth(const uint8_t* group, int t, int s) {
        uint64_t bits;
        std::memcpy(&bits, group + 2 * FIELDS * t + (t * s) / 2, 8);
        bits >>= (4 * t * s) & 7;
        return t == 16 ? bits : bits & ((1ull << (4 * t)) - 1);
    }
    // The codes dword j (j < DWORDS) of each lane holds, as lo and hi: the 4-bit formats' low
    // nibbles (step j) and high nibbles (step j + 4); Q8_0's codes + 128 (step j) in lo, hi
    // unused (Mask __mmask16: zmm lanes; __mmask8: half width, ymm; lanes past t zero).
    static constexpr int DWORDS = NIBBLES ? 4 : 8;
    template <class Mask>
    static inline auto dword(const uint8_t* group, int t, Mask lanes, int j) {
        const auto v = lane_dwords(lanes, group + HEADER * t + 4 * t * j);
        struct Codes {
            decltype(lane_dwords(lanes, group)) lo, hi;
        };
        if constexpr (NIBBLES) {
            auto lo = low_nibbles(v), hi = high_nibbles(v);
            if constexpr (FIFTH) {
                lo = add16(lo, fifth(group, t, j));
                hi = add16(hi, fifth(group, t, j + 4));
            }
            if constexpr (E8M0) {
                lo = lookup16(e2m1_plus_12(), lo);
                hi = lookup16(e2m1_plus_12(), hi);
            }
            return Codes{lo, hi};
        } else {
            return Codes{plus_128(v), v};
        }
    }
    // step(s, w) for s = 0..7 with w the lanes' u8 codes of step s (Q8_0: + 128, which init
    // folds out), lanes past t zero
    template <class Mask, class Step>
    static inline void steps(const uint8_t* group, int t, Mask lanes, Step&& step) {
#pragma GCC unroll 8
        for (int j = 0; j < DWORDS; ++j) {
            const auto w = dword(group, t, lanes, j);
            step(j, w.lo);
            if constexpr (NIBBLES) step(j + 4, w.hi);
        }
    }
    // header field f (0: d, 1: m) of the lanes' blocks; E8M0: e8m0_half of the scale bytes
    // (mxfp4.h's values: 2^(e - 128), e = 0, 1 subnormal)
    static inline __m512 field(const uint8_t* group, int t, __mmask16 lanes, int f) {
        if constexpr (E8M0) {
            const __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, group));
            const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
        }
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, group + 2 * t * f));
    }
    static inline __m256 field8(const uint8_t* group, int t, __mmask8 lanes, int f) {
        if constexpr (E8M0) return _mm512_castps512_ps256(field(group, t, static_cast<__mmask16>(lanes), f));
        return _mm256_cvtph_ps(_mm_maskz_loadu_epi16(lanes, group + 2 * t * f));
    }
};
using Q4_0X = Interleaved<18, 8, 1, true>;
using Q4_1X = Interleaved<20, 0, 2, true>;
using Q5_0X = Interleaved<22, 16, 1, true, true>;
using Q8_0X = Interleaved<34, 128, 1, false>;
using MXFP4X = Interleaved<17, 12, 0, true, false, true>;

// MXFP4 (gpt-oss's experts): the doubled E2M1 value of each code plus 12, as u8 (one vpshufb
// per pair; init folds the -12 back out), Q4_0's nibble order, and a's and b's E8M0 scale
// (E8M0_HALF, mxfp4.h: the halved power of two that matches the doubled values).
struct MXFP4 {
    static constexpr int QK = 32, BYTES = 17, UNIT_K = 64, PAIRS = 1, OFF = 12, ROUND = 0;
    static constexpr bool MIN = false;
    struct Ctx {};
    static inline void prepare(const uint8_t*, const uint8_t*, Ctx&) {}
    static inline Pair decode(const uint8_t* a, const uint8_t* b, int, const Ctx&) {
        const __m512i kv = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
        const __m512 d = _mm512_mask_blend_ps(static_cast<__mmask16>(0xFF00), _mm512_set1_ps(E8M0_HALF.v[a[0]]),
                                              _mm512_set1_ps(E8M0_HALF.v[b[0]]));
        return {_mm512_shuffle_epi8(kv, nibble_codes(a + 1, b + 1)), d, _mm512_setzero_ps()};
    }
};

// The K-quants meet activations rounded per 256 (one d per super-block, as llama.cpp's q8_K)
// and sum a whole super-block in integers: four dot products (vpdpbusd: int32 lanes of 4
// codes, each lane inside one scale group), packed to int16 two at a time (every |sum| is
// below 2^15) and multiplied by their group scales in two vpdpwssd; one float step per
// super-block (and one for Q4_K's mins) where the 32-wide rounding takes four.
struct Super {
    __m512i q[4];  // u8 codes; q[2i] and q[2i + 1] pack together (vpackssdw's lane order)
    __m512i s[2];  // the int16 scale of each packed sum
    __m512 d;      // the super-block's d
    __m512 m;      // Q4_K: -(dmin * min_j) in lanes 0..7 (sub-block j in k order), zero above
    __m512i off;   // Q6_K: -OFF * scale_g as int16 elements 0..15 (group g in k order), zero above
};

// vpshufb controls building a pack's int16 scales from a 128-bit lane of scale bytes: int16
// element t of 128-bit lane j takes byte index(j, t); `high` puts it in the high byte (for a
// signed scale, shifted down arithmetically after), else in the low byte with a zero above.
template <class Index>
static inline __m512i scale_control(Index index, bool high) {
    alignas(64) int8_t c[64];
    for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 8; ++t) {
            const int8_t i = static_cast<int8_t>(index(j, t)), zero = static_cast<int8_t>(0x80);
            c[16 * j + 2 * t] = high ? zero : i;
            c[16 * j + 2 * t + 1] = high ? i : zero;
        }
    return _mm512_load_si512(c);
}

// Q4_K: eight 32-weight sub-blocks with 6-bit scales and mins; qs[64h ..] holds sub-blocks
// 4h, 4h + 2 (low nibbles of its two 32-byte halves) and 4h + 1, 4h + 3 (high nibbles), so
// q[2h] = [4h | 4h + 2], q[2h + 1] = [4h + 1 | 4h + 3], and the row's codes are stored in that
// order (ROUND 2). Packed lane j, element t: sub-block (t >> 2) + 2 (j >> 1), + 4 for pack 1.
struct Q4_K {
    static constexpr int QK = 256, BYTES = 144, OFF = 0, ROUND = 2;
    static constexpr bool MIN = true;
    static inline Super decode(const uint8_t* b) {
        static const __m512i c0 = scale_control([](int j, int t) { return (t >> 2) + 2 * (j >> 1); }, false);
        static const __m512i c1 = scale_control([](int j, int t) { return 4 + (t >> 2) + 2 * (j >> 1); }, false);
        const __m128i sm = scale_min_k4_bytes(b + 4);  // scales 0..7, mins 0..7
        const __m512i sb = _mm512_broadcast_i32x4(sm);
        Super w;
        w.s[0] = _mm512_shuffle_epi8(sb, c0);
        w.s[1] = _mm512_shuffle_epi8(sb, c1);
        w.d = _mm512_set1_ps(fp16_to_f32(b));
        const __m512 mins = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
        w.m = _mm512_mul_ps(_mm512_set1_ps(-fp16_to_f32(b + 2)), mins);
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int h = 0; h < 2; ++h) {
            const __m512i v = _mm512_loadu_si512(b + 16 + 64 * h);
            w.q[2 * h] = _mm512_and_si512(v, low);
            w.q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        return w;
    }
};

// Q6_K: sixteen 16-weight groups with int8 scales, codes 0..63 minus 32 (the -32 meets the
// row's group sums in one more vpdpwssd: init's per-lane sums would not stay in L1 beside the
// codes of eight rows of a long k).
// Half h (128 weights): ql[64h ..] gives the low 4 bits (low nibbles: weights 0..63, high:
// 64..127), qh[32h ..] the top 2 (bit pairs 0..3 for weights l, l + 32, l + 64, l + 96), so
// q[2h] and q[2h + 1] are weights 0..63 and 64..127 in k order (ROUND 1). Packed lane j,
// element t: group 4 (t >> 2) + j, + 8 for pack 1.
struct Q6_K {
    static constexpr int QK = 256, BYTES = 210, OFF = 32, ROUND = 1;
    static constexpr bool MIN = false;
    static inline Super decode(const uint8_t* b) {
        static const __m512i c0 = scale_control([](int j, int t) { return 4 * (t >> 2) + j; }, true);
        static const __m512i c1 = scale_control([](int j, int t) { return 8 + 4 * (t >> 2) + j; }, true);
        const __m512i sc = _mm512_broadcast_i32x4(load16(b + 192));
        Super w;
        w.s[0] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc, c0), 8);
        w.s[1] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc, c1), 8);
        w.d = _mm512_set1_ps(fp16_to_f32(b + 208));
        w.m = _mm512_setzero_ps();
        const __m256i scale16 = _mm256_cvtepi8_epi16(load16(b + 192));
        w.off = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scale16, 5)));
        const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
        // per 16-bit lane shift counts: the first 32 bytes' pairs, then the second 32's
        const __m512i up = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        const __m512i down = _mm512_mask_blend_epi64(0xF0, _mm512_setzero_si512(), _mm512_set1_epi16(2));
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(b + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(load32(b + 128 + 32 * h));
            w.q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_and_si512(_mm512_sllv_epi16(qh, up), top));
            w.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                                             _mm512_and_si512(_mm512_srlv_epi16(qh, down), top));
        }
        return w;
    }
};

// ---------------------------------------------------------------- the row x column kernel

// Both kernels' frame: M x G accumulators at zero and the G weight rows of columns
// c0 + g * stride (row_groups.h's streams; 1: adjacent), then out = each accumulator's sum
// through reduce4.
template <int M, int G>
static inline void start_columns(const Problem& p, int64_t c0, int64_t stride, __m512 (&acc)[M][G],
                                 const uint8_t* (&rows)[G]) {
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
}

template <int M, int G>
static inline void store_columns(const Problem& p, int64_t c0, int64_t stride, const __m512 (&acc)[M][G]) {
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
        alignas(16) float lanes[4];
        _mm_store_ps(lanes, reduce4(acc[r][0], G > 1 ? acc[r][1] : z, G > 2 ? acc[r][2] : z, G > 3 ? acc[r][3] : z));
        for (int g = 0; g < G; ++g) p.out[r * p.n + c0 + g * stride] = lanes[g];
    }
}

// Columns c0 + g * stride (row_groups.h's streams; 1: adjacent).
template <class F, int M, int G>
static void cols(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m512 acc[M][G];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t units = (p.k + F::UNIT_K - 1) / F::UNIT_K;
    const int64_t unit_bytes = F::BYTES * (F::UNIT_K / F::QK);
    const NextInStreams<G> ahead(rows, p.row_bytes, units);
    for (int64_t u = 0; u < units; ++u) {
        // the second block of a 32-weight unit; the first again for an odd last block
        const bool single = F::QK == 32 && (u + 1) * F::UNIT_K > p.k;
        typename F::Ctx ctx[G];
        ahead.at(u);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) F::prepare(rows[g] + u * unit_bytes, nullptr, ctx[g]);
#pragma GCC unroll 4
        for (int pi = 0; pi < F::PAIRS; ++pi) {
            const int64_t lane = (u * F::UNIT_K + 64 * pi) / 4;  // into the per-lane arrays
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                const uint8_t* a = rows[g] + u * unit_bytes;
                const Pair w = F::decode(a, single ? a : a + F::BYTES, pi, ctx[g]);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r) {
                    const __m512i xq = _mm512_loadu_si512(x.q + r * x.ld_q + 4 * lane);
                    const __m512i init =
                        F::OFF == 0 ? _mm512_setzero_si512() : _mm512_loadu_si512(x.init + r * x.ld_lane + lane);
                    const __m512i dot = _mm512_dpbusd_epi32(init, w.q, xq);
                    const __m512 s = _mm512_mul_ps(w.d, _mm512_loadu_ps(x.dx + r * x.ld_lane + lane));
                    acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[r][g]);
                    if (F::MIN) acc[r][g] = _mm512_fmadd_ps(w.m, _mm512_loadu_ps(x.xs + r * x.ld_lane + lane), acc[r][g]);
                }
            }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

// Interleaved 32-wide rows (ROUND 3) at columns c0 + g * stride: per group of 16 blocks,
// lane l holds block 16 gi + l: I = init + eight vpdpbusd (exact), acc = fma(float(I), d * dx,
// acc) and, for Q4_1, acc = fma(m, xs, acc). A short last group of t blocks: if t > 8, lanes
// t..15 meet zero codes, scales and activations (fmas adding +0); if t <= 8, lanes 8..15 are
// left as they are and lanes 0..7 take the same steps at half width (the AVX2 build skips its
// second half). out = the sum of acc (reduce4).
template <class F, int M, int G>
static void cols_x16(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m512 acc[M][G];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t groups = x16_groups(p.k);
    const NextInStreams<G> ahead(rows, p.row_bytes, groups);
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int t = x16_blocks(p.k, gi);
        const int64_t slot = 16 * gi;  // the group's first block: init, dx and xs
        ahead.at(gi);
        if (t <= 8) {
            const __mmask8 lanes = static_cast<__mmask8>((1u << t) - 1);
            const __mmask16 low = static_cast<__mmask16>(0x00FF);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                const uint8_t* group = rows[g] + gi * 16 * F::BYTES;
                __m256i dot[M];
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r) dot[r] = load32(reinterpret_cast<const uint8_t*>(x.init + r * x.ld_lane + slot));
                F::steps(group, t, lanes, [&](int s, __m256i w) {
#pragma GCC unroll 8
                    for (int r = 0; r < M; ++r)
                        dot[r] = _mm256_dpbusd_epi32(dot[r], w, load32(reinterpret_cast<const uint8_t*>(x.q + r * x.ld_q + 512 * gi + 64 * s)));
                });
                const __m256 d = F::field8(group, t, lanes, 0);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r) {
                    const __m256 sc = _mm256_mul_ps(d, _mm256_loadu_ps(x.dx + r * x.ld_lane + slot));
                    acc[r][g] = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(_mm256_cvtepi32_ps(dot[r])),
                                                      _mm512_castps256_ps512(sc), acc[r][g], low);
                }
                if (F::MIN) {
                    const __m512 m = _mm512_castps256_ps512(F::field8(group, t, lanes, 1));
#pragma GCC unroll 8
                    for (int r = 0; r < M; ++r)
                        acc[r][g] = _mm512_mask3_fmadd_ps(m, _mm512_castps256_ps512(_mm256_loadu_ps(x.xs + r * x.ld_lane + slot)),
                                                          acc[r][g], low);
                }
            }
            continue;
        }
        const __mmask16 lanes = static_cast<__mmask16>((1u << t) - 1);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            const uint8_t* group = rows[g] + gi * 16 * F::BYTES;
            __m512i dot[M];
#pragma GCC unroll 8
            for (int r = 0; r < M; ++r) dot[r] = _mm512_loadu_si512(x.init + r * x.ld_lane + slot);
            F::steps(group, t, lanes, [&](int s, __m512i w) {
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
                    dot[r] = _mm512_dpbusd_epi32(dot[r], w, _mm512_loadu_si512(x.q + r * x.ld_q + 512 * gi + 64 * s));
            });
            const __m512 d = F::field(group, t, lanes, 0);
#pragma GCC unroll 8
            for (int r = 0; r < M; ++r) {
                const __m512 sc = _mm512_mul_ps(d, _mm512_loadu_ps(x.dx + r * x.ld_lane + slot));
                acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), sc, acc[r][g]);
            }
            if (F::MIN) {
                const __m512 m = F::field(group, t, lanes, 1);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
                    acc[r][g] = _mm512_fmadd_ps(m, _mm512_loadu_ps(x.xs + r * x.ld_lane + slot), acc[r][g]);
            }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

// ------------------------------------------------- prefill: row groups as packed tiles
// cols_x16 over TILE_ROWS or more rows (a prefill, or a decode of several sequences) with the
// same per-output sequence, so
// the same bits, laid out for throughput: a row group's activations are first repacked into a
// Tile (qmatmul_vnni.h), so every load of the inner loop is a constant offset from one pointer, and
// the loop takes the steps outermost: each dword of the G columns' codes is decoded once and
// each activation register feeds all G columns. The M x G integer sums stay in registers for a
// 512-wide group; the float accumulators live in L1 (one load and store per group). Before,
// the one kernel for every row count spilled its pointers and accumulators here. Zen 4, one
// thread, 512 rows (tools/int8_shapes.py --m 512): SmolLM2's ffn_up 8.68 -> 6.11 ms, attn_q
// 3.35 -> 2.29, ffn_down 5.42 -> 4.04; an 8,000-token prefill 24.5 -> 22.3 s.

// A tile group's integer sums at either width (lanes __mmask16: zmm, all 16 blocks; __mmask8:
// ymm, the half-width last group): dot[r][g] = init of row r + the group's vpdpbusd with the
// codes of column g, steps outermost (each decoded dword meets every row, each activation
// register every column).
static inline void load_lanes(__m512i& v, const void* p) { v = _mm512_load_si512(p); }
static inline void load_lanes(__m256i& v, const void* p) { v = _mm256_load_si256(static_cast<const __m256i*>(p)); }
static inline __m512i dpbusd(__m512i acc, __m512i w, __m512i x) { return _mm512_dpbusd_epi32(acc, w, x); }
static inline __m256i dpbusd(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(acc, w, x); }

template <class F, int M, int G, class Mask, class V>
static inline void tile_sums(const uint8_t* const (&group)[G], int t, Mask lanes, const int8_t* xq, const int32_t* init,
                             V (&dot)[M][G]) {
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
        V first;
        load_lanes(first, init + 16 * r);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) dot[r][g] = first;
    }
#pragma GCC unroll 8
    for (int j = 0; j < F::DWORDS; ++j) {
        decltype(F::dword(group[0], t, lanes, j)) w[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) w[g] = F::dword(group[g], t, lanes, j);
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
            V lo;
            load_lanes(lo, xq + 64 * (M * j + r));
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) dot[r][g] = dpbusd(dot[r][g], w[g].lo, lo);
            if constexpr (F::DWORDS == 4) {
                V hi;
                load_lanes(hi, xq + 64 * (M * (j + 4) + r));
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g) dot[r][g] = dpbusd(dot[r][g], w[g].hi, hi);
            }
        }
    }
}

// Columns c0 + g * stride of the tile's M rows: cols_x16's arithmetic per output (the same
// integer sums, the same float steps in group order, the same reduce4), in tile order.
template <class F, int M, int G>
static void tile_cols(const Problem& p, const Tile& x, int64_t c0, int64_t stride) {
    alignas(64) float acc[M][G][16];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) _mm512_store_ps(acc[r][g], _mm512_setzero_ps());
    const uint8_t* rows[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
    const int64_t groups = x16_groups(p.k);
    const NextInStreams<G> ahead(rows, p.row_bytes, groups);
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int t = x16_blocks(p.k, gi);
        const int8_t* xq = x.q + 64 * 8 * M * gi;
        const int64_t at = 16 * M * gi;
        const uint8_t* group[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) group[g] = rows[g] + gi * 16 * F::BYTES;
        ahead.at(gi);
        if (t <= 8) {  // the half-width last group: lanes 0..7, as cols_x16
            const __mmask8 lanes = static_cast<__mmask8>((1u << t) - 1);
            const __mmask16 low = static_cast<__mmask16>(0x00FF);
            __m256i dot[M][G];
            tile_sums<F, M, G>(group, t, lanes, xq, x.init + at, dot);
            __m256 d[G];
            __m512 m[G];
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                d[g] = F::field8(group[g], t, lanes, 0);
                if (F::MIN) m[g] = _mm512_castps256_ps512(F::field8(group[g], t, lanes, 1));
            }
#pragma GCC unroll 8
            for (int r = 0; r < M; ++r) {
                const __m256 dx = _mm256_load_ps(x.dx + at + 16 * r);
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g) {
                    const __m256 sc = _mm256_mul_ps(d[g], dx);
                    __m512 a = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(_mm256_cvtepi32_ps(dot[r][g])),
                                                     _mm512_castps256_ps512(sc), _mm512_load_ps(acc[r][g]), low);
                    if (F::MIN)
                        a = _mm512_mask3_fmadd_ps(m[g], _mm512_castps256_ps512(_mm256_load_ps(x.xs + at + 16 * r)), a, low);
                    _mm512_store_ps(acc[r][g], a);
                }
            }
            continue;
        }
        const __mmask16 lanes = static_cast<__mmask16>((1u << t) - 1);
        __m512i dot[M][G];
        tile_sums<F, M, G>(group, t, lanes, xq, x.init + at, dot);
        __m512 d[G], m[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            d[g] = F::field(group[g], t, lanes, 0);
            if (F::MIN) m[g] = F::field(group[g], t, lanes, 1);
        }
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
            const __m512 dx = _mm512_load_ps(x.dx + at + 16 * r);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][g]), _mm512_mul_ps(d[g], dx), _mm512_load_ps(acc[r][g]));
                if (F::MIN) a = _mm512_fmadd_ps(m[g], _mm512_load_ps(x.xs + at + 16 * r), a);
                _mm512_store_ps(acc[r][g], a);
            }
        }
    }
    // four accumulators per reduce4 (each lane's tree reads only its own accumulator)
    constexpr int SUMS = M * G;
#pragma GCC unroll 4
    for (int i = 0; i < SUMS; i += 4) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u)
            a[u] = i + u < SUMS ? _mm512_load_ps(acc[(i + u) / G][(i + u) % G]) : _mm512_setzero_ps();
        alignas(16) float lanes[4];
        _mm_store_ps(lanes, reduce4(a[0], a[1], a[2], a[3]));
        for (int u = 0; u < 4 && i + u < SUMS; ++u)
            p.out[((i + u) / G) * p.n + c0 + ((i + u) % G) * stride] = lanes[u];
    }
}

// The K-quants' columns c0 + g * stride: per super-block, I = (Q6_K: -OFF * the group sums
// times their scales, then) the two packed dot products times their scales (int32, exact),
// then acc = fma(float(I), d * dx, acc) and, for Q4_K, acc = fma(m, sub, acc) with the row's
// sub-block sums; out = the sum of acc (reduce4).
template <class F, int M, int G>
static void cols_super(const Problem& p, const QuantRows& x, int64_t c0, int64_t stride) {
    __m512 acc[M][G];
    const uint8_t* rows[G];
    start_columns<M, G>(p, c0, stride, acc, rows);
    const int64_t units = p.k / F::QK;
    const NextInStreams<G> ahead(rows, p.row_bytes, units);
    for (int64_t u = 0; u < units; ++u) {
        ahead.at(u);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            const Super w = F::decode(rows[g] + u * F::BYTES);
#pragma GCC unroll 8
            for (int r = 0; r < M; ++r) {
                const int8_t* xq = x.q + r * x.ld_q + F::QK * u;
                __m512i dot[4];
#pragma GCC unroll 4
                for (int t = 0; t < 4; ++t)
                    dot[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q[t], _mm512_loadu_si512(xq + 64 * t));
                __m512i sum = _mm512_setzero_si512();
                if (F::OFF != 0) {
                    const __m256i gs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.gsum + 2 * r * x.ld_sub + 16 * u));
                    sum = _mm512_dpwssd_epi32(sum, w.off, _mm512_zextsi256_si512(gs));
                }
                sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(dot[0], dot[1]), w.s[0]);
                sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(dot[2], dot[3]), w.s[1]);
                const __m512 s = _mm512_mul_ps(w.d, _mm512_set1_ps(x.dx[r * x.ld_lane + F::QK / 4 * u]));
                acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, acc[r][g]);
                if (F::MIN)
                    acc[r][g] = _mm512_fmadd_ps(w.m, _mm512_zextps256_ps512(_mm256_loadu_ps(x.sub + r * x.ld_sub + 8 * u)),
                                                acc[r][g]);
            }
        }
    }
    store_columns<M, G>(p, c0, stride, acc);
}

#include "int8_sweep.h"
#include "int8_tiles.h"

// One group of <= GROUP_ROWS rows: M x G accumulators and G decoded pairs fit 32 registers.
template <class F>
static void group(const Problem& p, const QuantRows& x, int64_t c0, int64_t c1) {
    if constexpr (F::QK == 256) {
        // a super-block is decoded for one column at a time (its 8 registers), then every row
        // meets it: more columns would only add accumulators; four streams feed a decode
        switch (p.m) {
            case 1: cols_range<F, 1, 4>(p, x, c0, c1); break;
            case 2: cols_range<F, 2, 2>(p, x, c0, c1); break;
            case 3: cols_range<F, 3, 1>(p, x, c0, c1); break;
            case 4: cols_range<F, 4, 1>(p, x, c0, c1); break;
            case 5: cols_range<F, 5, 1>(p, x, c0, c1); break;
            case 6: cols_range<F, 6, 1>(p, x, c0, c1); break;
            case 7: cols_range<F, 7, 1>(p, x, c0, c1); break;
            default: cols_range<F, 8, 1>(p, x, c0, c1); break;
        }
        return;
    }
    switch (p.m) {
        case 1: cols_range<F, 1, 4>(p, x, c0, c1); break;
        case 2: cols_range<F, 2, 4>(p, x, c0, c1); break;
        case 3: cols_range<F, 3, 4>(p, x, c0, c1); break;
        case 4: cols_range<F, 4, 3>(p, x, c0, c1); break;
        case 5: cols_range<F, 5, 3>(p, x, c0, c1); break;
        case 6: cols_range<F, 6, 2>(p, x, c0, c1); break;
        case 7: cols_range<F, 7, 2>(p, x, c0, c1); break;
        default: cols_range<F, 8, 2>(p, x, c0, c1); break;
    }
}

}  // namespace

void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1) {
    dispatch(qtype, [&](auto fmt) { rows_range<decltype(fmt)>(p, x, c0, c1); });
}

TileFns tile_fns() { return {tiles_used_of, tiles_bytes_of, tile_chunks_of, pack_tiles_of, tiled_columns_of}; }
}  // namespace vnni
}  // namespace agentkv

#pragma GCC pop_options
