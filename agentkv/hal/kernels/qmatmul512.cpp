// AVX-512 build of the quantized matmul: the same two paths as qmatmul.cpp with 16 lanes.
//
// Compiled for avx512f/bw/vl/dq by the pragma below whatever the global flags are, and only
// ever called after cpu_supports() said yes, so the library still loads and runs on AVX2-only
// CPUs. The headers are included under their own inline namespace (AGENTKV_ISA), so no
// inline function built here can be folded into the AVX2 code by the linker; nothing from
// the standard library is used under the pragma, since its inline functions have no such
// namespace (tests/hal checks the object files for weak symbols).
//
// The one accumulation order of this build, for output (r, c):
//   acc = 0 (16 lanes); for each 16-wide chunk j of k in order:
//   acc = fma(x[r, 16j..16j+16), w[c, 16j..16j+16), acc);  out = sum(acc), reduce4's tree
// where w is the weight dequantized exactly as gguf-py does (the same decoders, joined to
// 16 lanes), so both paths below give a row the same bits whatever rides with it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qmatmul_impl.h"

namespace agentkv {
namespace avx512 {
bool cpu_supports() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
}  // namespace avx512
}  // namespace agentkv

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define AGENTKV_ISA isa_avx512
#include "fp16_table.h"
#include "quant.h"
#include "simd512.h"
#include "formats512.h"
#include "mxfp4_512.h"

namespace agentkv {
namespace avx512 {
namespace {

constexpr int TILE_R = 6, TILE_C = 4;  // prefill_t switches on TILE_R
constexpr int64_t PANEL_BYTES = 192 * 1024;  // decoded f32 panel kept in L2
constexpr int64_t MAX_PANEL = 96;
constexpr int64_t LONG_K = 1024, K_BLOCK = 512;  // k blocking for rows longer than LONG_K
constexpr int GROUP_ROWS = 8;      // rows one decode_cols call holds in registers
constexpr int64_t COL_BLOCK = 24;  // columns a row group sweeps before the next group (L1)

// out[0 .. C) = the sums of acc[0 .. C), C <= 4, through simd512.h's reduce4 (the one
// horizontal sum of this build: decode, prefill and tail columns alike).
template <int C>
__attribute__((always_inline)) static inline void store_sums(const __m512* acc, float* out) {
    static_assert(C >= 1 && C <= 4, "store_sums reduces at most four accumulators");
    const __m512 z = _mm512_setzero_ps();
    const __m128 s = reduce4(acc[0], C > 1 ? acc[1] : z, C > 2 ? acc[2] : z, C > 3 ? acc[3] : z);
    if (C == 4) {
        _mm_storeu_ps(out, s);
        return;
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, s);
    for (int c = 0; c < C; ++c) out[c] = lanes[c];
}

static inline __m128i load16(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Any format: its AVX2 decoder's 4 x 8 lanes joined into 2 x 16 (same values, same bits).
template <class F>
struct Wide {
    static constexpr int QK = F::QK, BYTES = F::BYTES, UNIT = 1;
    struct Ctx {};
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int sub, const Ctx&, __m512 out[2]) {
        __m256 v[4];
        F::decode(b, sub, v);
        out[0] = _mm512_insertf32x8(_mm512_castps256_ps512(v[0]), v[1], 1);
        out[1] = _mm512_insertf32x8(_mm512_castps256_ps512(v[2]), v[3], 1);
    }
};

// Native decoders for the formats real files are made of. A decoder yields the 32 weights
// of sub-block `sub` as 2 x 16 lanes; `prepare` first works out what a whole block shares
// (the K-quants' sub-block scales), once per block instead of once per sub-block. The
// weight values are gguf-py's except that Q4_1 and Q4_K fuse scale and min into one fma
// (d * q + m rounded once): still one fixed value per weight, used by both paths.
struct NoCtx {};
struct W8_0 {
    static constexpr int QK = 32, BYTES = 34, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        const __m512 d = _mm512_set1_ps(fp16_at(b));  // a broadcast load (fp16_table.h)
        out[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b + 2))), d);
        out[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b + 18))), d);
    }
};

// The 4-bit formats decode through a table: lane j of `lut` holds the weight value of code j,
// computed by the same fma or mul that decoding code j itself would round, so a lookup
// gives that weight's bits (one permute instead of a convert and an fma per 16 weights).
// vpermps reads only an index's low 4 bits, so the low nibbles need no mask.
static inline __m512 iota16() {
    return _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f);
}

static inline void lookup_nibbles(const uint8_t* qs, const __m512 lut, __m512 out[2]) {
    const __m512i a = _mm512_cvtepu8_epi32(load16(qs));
    out[0] = _mm512_permutexvar_ps(a, lut);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), lut);
}

// W4_0 and W4_1 build a block's table from its scales read through FP16_F32 (fp16_table.h):
// two loads on the load ports instead of a conversion and shuffles on the vector ports that
// one-row decode is bound by. One path for decode and prefill alike.
struct W4_0 {
    static constexpr int QK = 32, BYTES = 18, UNIT = 1;
    struct Ctx {
        __m512 lut;  // d * (j - 8)
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        ctx.lut = _mm512_mul_ps(_mm512_set1_ps(fp16_at(b)), _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0f)));
    }
    static inline void decode(const uint8_t* b, int, const Ctx& ctx, __m512 out[2]) { lookup_nibbles(b + 2, ctx.lut, out); }
};

struct W4_1 {
    static constexpr int QK = 32, BYTES = 20, UNIT = 1;
    struct Ctx {
        __m512 lut;  // fma(d, j, m)
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        ctx.lut = _mm512_fmadd_ps(_mm512_set1_ps(fp16_at(b)), iota16(), _mm512_set1_ps(fp16_at(b + 2)));
    }
    static inline void decode(const uint8_t* b, int, const Ctx& ctx, __m512 out[2]) { lookup_nibbles(b + 4, ctx.lut, out); }
};

struct W4_K {
    static constexpr int QK = 256, BYTES = 144, UNIT = 2;
    struct Ctx {
        alignas(64) float v[16];  // d * scale_j at j, dmin * min_j at 8 + j
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) { _mm512_store_ps(ctx.v, formats512::k4_scale_products(b)); }
    // Sub-blocks 2c and 2c+1 together: the low and high nibbles of the same 32 bytes, each
    // through its sub-block's table fmsub(d, j, dm).
    static inline void decode(const uint8_t* b, int c, const Ctx& ctx, __m512 out[4]) {
        const uint8_t* q = b + 16 + 32 * c;
        const __m512 lut0 = _mm512_fmsub_ps(_mm512_set1_ps(ctx.v[2 * c]), iota16(), _mm512_set1_ps(ctx.v[8 + 2 * c]));
        const __m512 lut1 =
            _mm512_fmsub_ps(_mm512_set1_ps(ctx.v[2 * c + 1]), iota16(), _mm512_set1_ps(ctx.v[9 + 2 * c]));
        for (int i = 0; i < 2; ++i) {
            const __m512i v = _mm512_cvtepu8_epi32(load16(q + 16 * i));
            out[i] = _mm512_permutexvar_ps(v, lut0);
            out[2 + i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut1);
        }
    }
};

struct W6_K {
    static constexpr int QK = 256, BYTES = 210, UNIT = 1;
    struct Ctx {
        alignas(64) float d[16];  // d * scale_j
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b + 192)));
        _mm512_store_ps(ctx.d, _mm512_mul_ps(_mm512_set1_ps(fp16_to_f32(b + 208)), sc));
    }
    static inline void decode(const uint8_t* b, int sub, const Ctx& ctx, __m512 out[2]) {
        const int h = sub >> 2, t = sub & 3;
        __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (t & 1)));
        ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t >> 1))), _mm256_set1_epi8(0x0F));
        __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(ql, _mm256_slli_epi16(qh, 4)), _mm256_set1_epi8(32));
        const __m512 d0 = _mm512_set1_ps(ctx.d[2 * sub]), d1 = _mm512_set1_ps(ctx.d[2 * sub + 1]);
        out[0] = _mm512_mul_ps(d0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
        out[1] = _mm512_mul_ps(d1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
    }
};

// Q5_0's 32 codes' values d * (q - 16) as two 16-entry tables (codes 0-15: d * (j - 16);
// 16-31: d * j), each the one rounding of the exact product gguf-py's d * (q - 16) rounds;
// weight i's fifth bit (bit i of the little-endian u32 qh, loaded into a lane mask) picks
// the table as bit 4 of a vpermt2ps index.
struct W5_0 {
    static constexpr int QK = 32, BYTES = 22, UNIT = 1;
    struct Ctx {
        __m512 low, high;
    };
    static inline void prepare(const uint8_t* b, Ctx& ctx) {
        const __m512 d = _mm512_set1_ps(fp16_at(b));
        ctx.low = _mm512_mul_ps(d, _mm512_sub_ps(iota16(), _mm512_set1_ps(16.0f)));
        ctx.high = _mm512_mul_ps(d, iota16());
    }
    static inline void decode(const uint8_t* b, int, const Ctx& ctx, __m512 out[2]) {
        uint16_t qh0, qh1;  // the fifth bits of weights 0-15 and 16-31
        std::memcpy(&qh0, b + 2, 2);
        std::memcpy(&qh1, b + 4, 2);
        const __m512i a = _mm512_cvtepu8_epi32(load16(b + 6)), sixteen = _mm512_set1_epi32(16);
        const __m512i i0 =
            _mm512_mask_or_epi32(_mm512_and_si512(a, _mm512_set1_epi32(0x0F)), static_cast<__mmask16>(qh0), a, sixteen);
        const __m512i hi = _mm512_srli_epi32(a, 4);
        const __m512i i1 = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh1), hi, sixteen);
        out[0] = _mm512_permutex2var_ps(ctx.low, i0, ctx.high);
        out[1] = _mm512_permutex2var_ps(ctx.low, i1, ctx.high);
    }
};

struct WF32 {
    static constexpr int QK = 32, BYTES = 128, UNIT = 1;
    using Ctx = NoCtx;
    static inline void prepare(const uint8_t*, Ctx&) {}
    static inline void decode(const uint8_t* b, int, const Ctx&, __m512 out[2]) {
        const float* w = reinterpret_cast<const float*>(b);
        out[0] = _mm512_loadu_ps(w);
        out[1] = _mm512_loadu_ps(w + 16);
    }
};

// ---------------------------------------------------------------- decode (small m)

// A decode_cols call's start: zeroed accumulators and the weight rows of columns c0 + g * stride.
template <int M, int G>
static inline void start_cols(const Problem& p, int64_t c0, int64_t stride, __m512 (&acc)[M][G],
                              const uint8_t* (&rows)[G]) {
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
}

// Row r's G sums into columns c0 + g * stride (adjacent columns: one 4-lane store).
template <int G>
__attribute__((always_inline)) static inline void store_cols(const __m512* acc, float* out, int64_t stride) {
    if (stride == 1) {
        store_sums<G>(acc, out);
        return;
    }
    alignas(16) float sums[4];
    store_sums<G>(acc, sums);
    for (int g = 0; g < G; ++g) out[g * stride] = sums[g];
}

template <class F, int M, int G>
static void decode_cols(const Problem& p, int64_t c0, int64_t stride) {
    __m512 acc[M][G];
    const uint8_t* rows[G];
    start_cols<M, G>(p, c0, stride, acc, rows);
    constexpr int SUBS = F::QK / 32;
    const int64_t blocks = p.k / F::QK;
    const NextInStreams<G> ahead(rows, p.row_bytes, blocks);
    for (int64_t sb = 0; sb < blocks; ++sb) {
        typename F::Ctx ctx[G];
        ahead.at(sb);
        for (int g = 0; g < G; ++g) F::prepare(rows[g] + sb * F::BYTES, ctx[g]);
        for (int u = 0; u < SUBS / F::UNIT; ++u) {
            const float* xk = p.x + sb * F::QK + u * 32 * F::UNIT;
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                __m512 wv[2 * F::UNIT];
                F::decode(rows[g] + sb * F::BYTES, u, ctx[g], wv);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
                    for (int i = 0; i < 2 * F::UNIT; ++i)
                        acc[r][g] = _mm512_fmadd_ps(_mm512_loadu_ps(xk + r * p.k + 16 * i), wv[i], acc[r][g]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) store_cols<G>(acc[r], p.out + r * p.n + c0, stride);
}

#include "row_groups.h"

// One row group: M x G accumulators plus one column's decoded weights fit the 32 zmm registers.
template <class F>
static void decode_group(const Problem& p, int64_t c0, int64_t c1) {
    switch (p.m) {
        case 1: decode_cols_range<F, 1, 4>(p, c0, c1); break;
        case 2: decode_cols_range<F, 2, 4>(p, c0, c1); break;
        case 3: decode_cols_range<F, 3, 2>(p, c0, c1); break;
        case 4: decode_cols_range<F, 4, 2>(p, c0, c1); break;
        case 5: decode_cols_range<F, 5, 3>(p, c0, c1); break;
        case 6: decode_cols_range<F, 6, 3>(p, c0, c1); break;
        case 7: decode_cols_range<F, 7, 2>(p, c0, c1); break;
        default: decode_cols_range<F, 8, 2>(p, c0, c1); break;
    }
}

// ---------------------------------------------------------------- prefill (m > 4)

// R x C register tile over rows of x and decoded panel columns (stride k), for the k range
// [j0, j1): the accumulators start at zero when j0 = 0, else from `saved` (where the previous
// range left them), and end as sums in `out` when j1 = k, else back in `saved`. Splitting k
// this way keeps each accumulator's fma sequence exactly the unsplit one.
template <int R, int C>
static void tile(const float* x, int64_t ldx, const float* wp, int64_t k, int64_t j0, int64_t j1,
                 __m512* saved, float* out, int64_t ldo) {
    __m512 acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = j0 == 0 ? _mm512_setzero_ps() : saved[r * C + c];
    for (int64_t j = j0; j < j1; j += 16) {
        __m512 wv[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(wp + c * k + j);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_loadu_ps(x + r * ldx + j);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (j1 == k) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) store_sums<C>(acc[r], out + r * ldo);
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) saved[r * C + c] = acc[r][c];
    }
}

// One row tile against all `cols` panel columns over [j0, j1); column c's tile keeps its
// accumulators in saved[c * TILE_R ..).
template <int R>
static void tile_cols(const float* x, int64_t ldx, const float* wp, int64_t k, int64_t j0, int64_t j1,
                      __m512* saved, float* out, int64_t ldo, int64_t cols) {
    int64_t c = 0;
    for (; c + TILE_C <= cols; c += TILE_C)
        tile<R, TILE_C>(x, ldx, wp + c * k, k, j0, j1, saved + c * TILE_R, out + c, ldo);
    for (; c < cols; ++c) tile<R, 1>(x, ldx, wp + c * k, k, j0, j1, saved + c * TILE_R, out + c, ldo);
}

template <class F>
static void prefill_t(const Problem& p, int64_t c0, int64_t cols, float* scratch) {
    constexpr int SUBS = F::QK / 32;
    for (int64_t c = 0; c < cols; ++c) {
        const uint8_t* row = p.w + (c0 + c) * p.row_bytes;
        float* dst = scratch + c * p.k;
        for (int64_t sb = 0; sb < p.k / F::QK; ++sb) {
            typename F::Ctx ctx;
            F::prepare(row + sb * F::BYTES, ctx);
            for (int u = 0; u < SUBS / F::UNIT; ++u) {
                __m512 wv[2 * F::UNIT];
                F::decode(row + sb * F::BYTES, u, ctx, wv);
                for (int i = 0; i < 2 * F::UNIT; ++i) _mm512_storeu_ps(dst + sb * F::QK + 32 * F::UNIT * u + 16 * i, wv[i]);
            }
        }
    }
    // Long rows are swept in k blocks, so a row tile's slice of x stays in L1 while the
    // panel's columns pass by.
    const int64_t kb = p.k >= LONG_K ? K_BLOCK : p.k;
    __m512 saved[MAX_PANEL * TILE_R];
    for (int64_t r = 0; r < p.m; r += TILE_R) {
        const float* x = p.x + r * p.k;
        float* o = p.out + c0 + r * p.n;
        for (int64_t j0 = 0; j0 < p.k; j0 += kb) {
            const int64_t j1 = j0 + kb < p.k ? j0 + kb : p.k;
            switch (p.m - r < TILE_R ? p.m - r : TILE_R) {
                case 6: tile_cols<6>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
                case 5: tile_cols<5>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
                case 4: tile_cols<4>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
                case 3: tile_cols<3>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
                case 2: tile_cols<2>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
                default: tile_cols<1>(x, p.k, scratch, p.k, j0, j1, saved, o, p.n, cols); break;
            }
        }
    }
}

template <class Fn>
static void dispatch(int qtype, Fn&& fn) {
    switch (qtype) {
        case F32: fn(WF32{}); break;
        case Q4_0: fn(W4_0{}); break;
        case Q4_1: fn(W4_1{}); break;
        case Q5_0: fn(W5_0{}); break;
        case Q5_1: fn(Wide<FmtQ5_1>{}); break;
        case Q8_0: fn(W8_0{}); break;
        case Q4_K: fn(W4_K{}); break;
        case Q5_K: fn(Wide<FmtQ5_K>{}); break;
        case Q6_K: fn(W6_K{}); break;
        case F16: fn(formats512::WF16{}); break;
        case BF16: fn(formats512::WBF16{}); break;
        case I4G32: fn(formats512::WI4G32{}); break;
        case I8G32: fn(formats512::WI8G32{}); break;
        case F8G32: fn(Wide<FmtF8G32>{}); break;
        case MXFP4: fn(formats512::WMXFP4{}); break;
        default: break;  // qmatmul_raw validated qtype (and no std:: code is built for AVX-512 here)
    }
}

}  // namespace

void decode_range(const Problem& p, int qtype, int64_t c0, int64_t c1) {
    dispatch(qtype, [&](auto fmt) { decode_rows<decltype(fmt)>(p, c0, c1); });
}

int64_t panel_cols(int64_t k) {
    const int64_t fit = PANEL_BYTES / (4 * k) / TILE_C * TILE_C;
    return fit < TILE_C ? TILE_C : fit > MAX_PANEL ? MAX_PANEL : fit;
}

void prefill_panel(const Problem& p, int qtype, int64_t c0, int64_t cols, float* scratch) {
    dispatch(qtype, [&](auto fmt) { prefill_t<decltype(fmt)>(p, c0, cols, scratch); });
}

// The FMA peak's loop: 16 independent accumulators (two fma pipes of latency 4 need 8; more
// hides a late issue), each acc = acc * a + b with values that stay normal.
double fma_loop(int64_t iterations) {
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.001f * static_cast<float>(i));
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
    for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 2.0 * 16 * 16 * static_cast<double>(iterations);
}

}  // namespace avx512
}  // namespace agentkv

#pragma GCC pop_options
