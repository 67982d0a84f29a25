// x @ dequant(w).T for GGUF-quantized (and f32) weights, batch-invariant by construction.
//
// The one accumulation order (AVX2 build; qmatmul512.cpp is the same with 16 lanes and is
// used instead when the CPU has AVX-512, see active_isa). For output (r, c): acc = 0
// (8 lanes); for each 8-wide chunk j of k in order: acc = fma(x[r, 8j..8j+8),
// w[c, 8j..8j+8), acc); out = hsum8(acc). Both paths below follow it exactly, so a row's
// bits never depend on m, on which rows ride along, on the thread count (threads split
// columns only) or on tile edges:
//
//   decode  (m <= DECODE_MAX_ROWS): rows in groups of <= 8; G columns at a time, each
//                     weight block decoded in registers and applied to the group's rows;
//                     the groups take turns on a COL_BLOCK of columns, so every weight
//                     byte comes from DRAM once per call.
//   prefill (larger m): a panel of PANEL columns is decoded into a per-thread f32 scratch
//                     (L2-resident), then R x C register tiles sweep it for every row.
#include "qmatmul.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "formats_avx2.h"
#include "pool.h"
#include "qmatmul_impl.h"
#include "qmatmul_vnni.h"
#include "quant.h"
#include "mxfp4.h"

namespace agentkv {
namespace {

// The decode/prefill crossover per build, in rows, measured on SmolLM2's shapes (`agentkv
// bench kernels --threads 1 --clock cpu --m 1 2 4 5 8 12 16 24 32 48 64`): up to it,
// decoding each weight block in registers once per row group of 8 beats decoding a panel
// into scratch and sweeping it (AVX-512: about even at 64 rows, the decode path 25-30%
// faster at 32; AVX2: faster at every m to 48, its panel path being weaker).
constexpr int64_t DECODE_MAX_ROWS_AVX2 = 32;
constexpr int GROUP_ROWS = 8;      // rows one decode_cols call holds in registers
constexpr int64_t COL_BLOCK = 24;  // columns a row group sweeps before the next group (L1)
constexpr int PANEL = 24;  // columns decoded per scratch panel (a multiple of TILE_C)
constexpr int TILE_R = 4, TILE_C = 3;
// A decode GEMV only goes parallel past this many weight bytes per chunk: below it, handing
// work to the pool costs more than the microsecond or two of work. Threads split columns
// only, so this never changes bits.
constexpr int64_t MIN_TASK_BYTES = 16 * 1024;

// Decodes 32-weight unit u of weight row `row` (unit index over the whole row).
template <class F>
static inline void decode_unit(const uint8_t* row, int64_t u, __m256 wv[4]) {
    constexpr int SUBS = F::QK / 32;
    F::decode(row + (u / SUBS) * F::BYTES, static_cast<int>(u % SUBS), wv);
}

// decode_cols for a TABLED format (formats_avx2.h): the same fma sequence per output, each
// block's scalars converted beforehand, SPAN blocks per column at a time (NextInStreams
// prefetches by line, so small blocks sharing a cache line cost one prefetch).
template <class F, int M, int G>
static void decode_cols_tabled(const Problem& p, int64_t c0, int64_t stride) {
    constexpr int64_t SPAN = 64;
    __m256 acc[M][G];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
    const uint8_t* rows[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
    const int64_t blocks = p.k / F::QK;
    alignas(32) float s[G][2 * SPAN];
    const NextInStreams<G> ahead(rows, p.row_bytes, blocks);
    for (int64_t b0 = 0; b0 < blocks; b0 += SPAN) {
        const int64_t nb = blocks - b0 < SPAN ? blocks - b0 : SPAN;
        for (int g = 0; g < G; ++g)
            for (int64_t j = 0; j < nb; ++j) F::scalars(rows[g] + (b0 + j) * F::BYTES, s[g] + 2 * j);
        for (int64_t j = 0; j < nb; ++j) {
            ahead.at(b0 + j);
            const float* xk = p.x + (b0 + j) * F::QK;
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                __m256 wv[4];
                F::lookup(rows[g] + (b0 + j) * F::BYTES, s[g] + 2 * j, wv);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i)
                        acc[r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + r * p.k + 8 * i), wv[i], acc[r][g]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) p.out[r * p.n + c0 + g * stride] = hsum8(acc[r][g]);
}

// decode_cols for a PREPARED format (formats_avx2.h): each block's shared scales worked
// out once per column block, then its sub-blocks decoded with them; the same fma sequence.
template <class F, int M, int G>
static void decode_cols_prepared(const Problem& p, int64_t c0, int64_t stride) {
    __m256 acc[M][G];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
    const uint8_t* rows[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
    const NextInStreams<G> ahead(rows, p.row_bytes, p.k / F::QK);
    for (int64_t sb = 0; sb < p.k / F::QK; ++sb) {
        typename F::Ctx ctx[G];
        ahead.at(sb);
        for (int g = 0; g < G; ++g) F::prepare(rows[g] + sb * F::BYTES, ctx[g]);
        for (int sub = 0; sub < F::QK / 32; ++sub) {
            const float* xk = p.x + sb * F::QK + sub * 32;
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                __m256 wv[4];
                F::decode(rows[g] + sb * F::BYTES, sub, ctx[g], wv);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i)
                        acc[r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + r * p.k + 8 * i), wv[i], acc[r][g]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) p.out[r * p.n + c0 + g * stride] = hsum8(acc[r][g]);
}

template <class F, int M, int G>
static void decode_cols(const Problem& p, int64_t c0, int64_t stride) {
    if constexpr (formats_avx2::is_tabled<F>::value) {
        decode_cols_tabled<F, M, G>(p, c0, stride);
        return;
    } else if constexpr (formats_avx2::is_prepared<F>::value) {
        decode_cols_prepared<F, M, G>(p, c0, stride);
        return;
    }
    __m256 acc[M][G];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
    const uint8_t* rows[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) rows[g] = p.w + (c0 + g * stride) * p.row_bytes;
    const int64_t blocks = p.k / F::QK;
    const NextInStreams<G> ahead(rows, p.row_bytes, blocks);
    for (int64_t sb = 0; sb < blocks; ++sb) {
        ahead.at(sb);
        for (int sub = 0; sub < F::QK / 32; ++sub) {
            const float* xk = p.x + sb * F::QK + sub * 32;
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                __m256 wv[4];
                F::decode(rows[g] + sb * F::BYTES, sub, wv);
#pragma GCC unroll 8
                for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i)
                        acc[r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + r * p.k + 8 * i), wv[i],
                                                    acc[r][g]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) p.out[r * p.n + c0 + g * stride] = hsum8(acc[r][g]);
}

// This thread's prefill panel buffer (a chunk of columns is one call; the buffer outlives it).
static float* panel_scratch(int64_t floats) {
    thread_local std::vector<float> buffer;
    if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
    return buffer.data();
}

#include "row_groups.h"

// One row group: M x G accumulators plus one column's decoded weights fit the 16 ymm registers.
template <class F>
static void decode_group(const Problem& p, int64_t c0, int64_t c1) {
    switch (p.m) {
        case 1: decode_cols_range<F, 1, 4>(p, c0, c1); break;
        case 2: decode_cols_range<F, 2, 4>(p, c0, c1); break;
        case 3: decode_cols_range<F, 3, 2>(p, c0, c1); break;
        case 4: decode_cols_range<F, 4, 2>(p, c0, c1); break;
        case 5: decode_cols_range<F, 5, 2>(p, c0, c1); break;
        case 6: decode_cols_range<F, 6, 1>(p, c0, c1); break;
        case 7: decode_cols_range<F, 7, 1>(p, c0, c1); break;
        default: decode_cols_range<F, 8, 1>(p, c0, c1); break;
    }
}

// Threads split columns in chunks of a multiple of COL_BLOCK's divisors' lcm (12), so a
// chunk rarely ends in single-column tails. A decode (at most STREAM_ROWS rows) streams its
// weights, and each chunk restarts its row streams cold (the prefetchers and the software
// prefetch ramp up again), so it takes two chunks per thread (a late worker's share can still
// move to the caller); more rows are compute-bound and take sixteen for balance. On a Zen 4,
// two threads, int8 activations, 24 cold weights each (tools/cold_matmuls.py): Q4_K 7168 x 1024
// at 34 against 28 GB/s, Q6_K 1024 x 3584 at 36-39 against 26-27 GB/s with sixteen (f32: 19
// against 16). grouped.cpp's joined loops (a hybrid's input projections, a MoE step's experts)
// keep four: on gpt-oss's decode step two measured no better. Never changes a bit (threads
// split columns only).
constexpr int64_t STREAM_ROWS = 8;
static void decode_columns(const Problem& p, const std::function<void(int64_t, int64_t)>& body) {
    const int64_t grain = std::max<int64_t>(12, MIN_TASK_BYTES / p.row_bytes);
    parallel_chunks(p.n, grain, body, p.m <= STREAM_ROWS ? 2 : 16, 12);
}

// R x C register tile over rows r0.. and scratch columns (already decoded, stride k).
template <int R, int C>
static void tile(const float* x, int64_t ldx, const float* wp, int64_t k, float* out, int64_t ldo) {
    __m256 acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j += 8) {
        __m256 wv[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(wp + c * k + j);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_loadu_ps(x + r * ldx + j);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) out[r * ldo + c] = hsum8(acc[r][c]);
}

template <int R>
static void tile_cols(const float* x, int64_t ldx, const float* wp, int64_t k, float* out,
                      int64_t ldo, int cols) {
    int c = 0;
    for (; c + TILE_C <= cols; c += TILE_C) tile<R, TILE_C>(x, ldx, wp + c * k, k, out + c, ldo);
    for (; c < cols; ++c) tile<R, 1>(x, ldx, wp + c * k, k, out + c, ldo);
}

// A format's Ctx, or an empty one for formats without (so decode_row declares one either way).
template <class F, bool = formats_avx2::is_prepared<F>::value>
struct Prepared {
    struct Ctx {};
};
template <class F>
struct Prepared<F, true> {
    using Ctx = typename F::Ctx;
};

// One weight row decoded into f32 `dst` [k] (the prefill panel): the decode path's values,
// a PREPARED format's block scales worked out once per block.
template <class F>
static void decode_row(const uint8_t* row, int64_t k, float* dst) {
    for (int64_t sb = 0; sb < k / F::QK; ++sb) {
        const uint8_t* b = row + sb * F::BYTES;
        [[maybe_unused]] typename Prepared<F>::Ctx ctx;
        if constexpr (formats_avx2::is_prepared<F>::value) F::prepare(b, ctx);
        for (int sub = 0; sub < F::QK / 32; ++sub) {
            __m256 wv[4];
            if constexpr (formats_avx2::is_prepared<F>::value) {
                F::decode(b, sub, ctx, wv);
            } else {
                F::decode(b, sub, wv);
            }
            for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + sb * F::QK + 32 * sub + 8 * i, wv[i]);
        }
    }
}

template <class F>
static void prefill_path(const Problem& p) {
    const int64_t panels = (p.n + PANEL - 1) / PANEL;
    parallel_chunks(panels, 1, [&](int64_t b, int64_t e) {
        float* scratch = panel_scratch(PANEL * p.k);
        for (int64_t pi = b; pi < e; ++pi) {
            const int64_t c0 = pi * PANEL;
            const int cols = static_cast<int>(std::min<int64_t>(PANEL, p.n - c0));
            for (int c = 0; c < cols; ++c) decode_row<F>(p.w + (c0 + c) * p.row_bytes, p.k, scratch + c * p.k);
            int64_t r = 0;
            float* o = p.out + c0;
            for (; r + TILE_R <= p.m; r += TILE_R)
                tile_cols<TILE_R>(p.x + r * p.k, p.k, scratch, p.k, o + r * p.n, p.n, cols);
            switch (p.m - r) {
                case 3: tile_cols<3>(p.x + r * p.k, p.k, scratch, p.k, o + r * p.n, p.n, cols); break;
                case 2: tile_cols<2>(p.x + r * p.k, p.k, scratch, p.k, o + r * p.n, p.n, cols); break;
                case 1: tile_cols<1>(p.x + r * p.k, p.k, scratch, p.k, o + r * p.n, p.n, cols); break;
                default: break;
            }
        }
    });
}

// The AVX-512 build's driver: the same split (columns for decode, panels for prefill),
// threads deciding only which columns a kernel call owns.
static void run_avx512(const Problem& p, int qtype) {
    if (p.m <= avx512::DECODE_MAX_ROWS) {
        decode_columns(p, [&](int64_t b, int64_t e) { avx512::decode_range(p, qtype, b, e); });
        return;
    }
    const int64_t panel = avx512::panel_cols(p.k);
    parallel_chunks((p.n + panel - 1) / panel, 1, [&](int64_t b, int64_t e) {
        float* scratch = panel_scratch(panel * p.k);
        for (int64_t pi = b; pi < e; ++pi)
            avx512::prefill_panel(p, qtype, pi * panel, std::min(panel, p.n - pi * panel), scratch);
    });
}

template <class F>
static void run(const Problem& p) {
    if (p.m <= DECODE_MAX_ROWS_AVX2) {
        decode_columns(p, [&](int64_t b, int64_t e) { decode_rows<F>(p, b, e); });
        return;
    }
    prefill_path<F>(p);
}

template <class F>
static void dequant_rows(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, float* out) {
    parallel_chunks(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
            for (int64_t u = 0; u < k / 32; ++u) {
                __m256 wv[4];
                decode_unit<F>(w + c * row_bytes, u, wv);
                for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + c * k + 32 * u + 8 * i, wv[i]);
            }
        }
    });
}

}  // namespace

template <class Fn>
static void dispatch(int qtype, Fn&& fn) {
    switch (qtype) {
        case F32: fn(FmtF32{}); break;
        case Q4_0: fn(FmtQ4_0{}); break;
        case Q4_1: fn(FmtQ4_1{}); break;
        case Q5_0: fn(FmtQ5_0{}); break;
        case Q5_1: fn(FmtQ5_1{}); break;
        case Q8_0: fn(FmtQ8_0{}); break;
        case Q4_K: fn(FmtQ4_K{}); break;
        case Q5_K: fn(FmtQ5_K{}); break;
        case Q6_K: fn(FmtQ6_K{}); break;
        case F16: fn(FmtF16{}); break;
        case BF16: fn(FmtBF16{}); break;
        case I4G32: fn(FmtI4G32{}); break;
        case I8G32: fn(FmtI8G32{}); break;
        case F8G32: fn(FmtF8G32{}); break;
        case MXFP4: fn(FmtMXFP4{}); break;
        default: throw std::invalid_argument("agentkv kernels: unsupported qtype " + std::to_string(qtype));
    }
}

bool qtype_info(int qtype, int& block_weights, int& block_bytes) {
    switch (qtype) {
        case F32: block_weights = FmtF32::QK; block_bytes = FmtF32::BYTES; return true;
        case Q4_0: block_weights = FmtQ4_0::QK; block_bytes = FmtQ4_0::BYTES; return true;
        case Q4_1: block_weights = FmtQ4_1::QK; block_bytes = FmtQ4_1::BYTES; return true;
        case Q5_0: block_weights = FmtQ5_0::QK; block_bytes = FmtQ5_0::BYTES; return true;
        case Q5_1: block_weights = FmtQ5_1::QK; block_bytes = FmtQ5_1::BYTES; return true;
        case Q8_0: block_weights = FmtQ8_0::QK; block_bytes = FmtQ8_0::BYTES; return true;
        case Q4_K: block_weights = FmtQ4_K::QK; block_bytes = FmtQ4_K::BYTES; return true;
        case Q5_K: block_weights = FmtQ5_K::QK; block_bytes = FmtQ5_K::BYTES; return true;
        case Q6_K: block_weights = FmtQ6_K::QK; block_bytes = FmtQ6_K::BYTES; return true;
        case F16: block_weights = FmtF16::QK; block_bytes = FmtF16::BYTES; return true;
        case BF16: block_weights = FmtBF16::QK; block_bytes = FmtBF16::BYTES; return true;
        case I4G32: block_weights = FmtI4G32::QK; block_bytes = FmtI4G32::BYTES; return true;
        case I8G32: block_weights = FmtI8G32::QK; block_bytes = FmtI8G32::BYTES; return true;
        case F8G32: block_weights = FmtF8G32::QK; block_bytes = FmtF8G32::BYTES; return true;
        case MXFP4: block_weights = FmtMXFP4::QK; block_bytes = FmtMXFP4::BYTES; return true;
        case Q4_0X: block_weights = FmtQ4_0::QK; block_bytes = FmtQ4_0::BYTES; return true;
        case Q4_1X: block_weights = FmtQ4_1::QK; block_bytes = FmtQ4_1::BYTES; return true;
        case Q5_0X: block_weights = FmtQ5_0::QK; block_bytes = FmtQ5_0::BYTES; return true;
        case MXFP4X: block_weights = FmtMXFP4::QK; block_bytes = FmtMXFP4::BYTES; return true;
        case Q8_0X: block_weights = FmtQ8_0::QK; block_bytes = FmtQ8_0::BYTES; return true;
        default: return false;
    }
}

// The ISA every matmul and attention kernel of this process uses, and whether it is fixed.
// Unfixed (the low byte is the chosen ISA, -1 while none is chosen), set_isa may change it;
// the first kernel call fixes it (FIXED bit), and from then on only the same ISA is accepted:
// the two builds give different (each invariant) bits, so a process whose KV cache holds
// bits of one must never compute with the other. One atomic word: no kernel can slip
// between set_isa's check and its store.
static constexpr int FIXED = 0x100;
static std::atomic<int> g_isa{-1};

static int best_isa() { return avx512::cpu_supports() ? ISA_AVX512 : ISA_AVX2; }

bool isa_supported(int isa) {
    return isa == ISA_AVX2 || (isa == ISA_AVX512 && avx512::cpu_supports());
}

int active_isa() {
    int state = g_isa.load();
    if (state < 0) {
        g_isa.compare_exchange_strong(state, best_isa());
        state = g_isa.load();
    }
    return state & 0xff;
}

int fix_isa() {
    int state = g_isa.load();
    for (;;) {
        if (state >= 0 && (state & FIXED)) return state & 0xff;
        const int fixed = (state < 0 ? best_isa() : state) | FIXED;
        if (g_isa.compare_exchange_weak(state, fixed)) return fixed & 0xff;
    }
}

bool isa_fixed() {
    const int state = g_isa.load();
    return state >= 0 && (state & FIXED);
}

SetIsa set_isa(int isa) {
    if (isa != ISA_AVX2 && isa != ISA_AVX512) return SET_ISA_UNKNOWN;
    if (!isa_supported(isa)) return SET_ISA_UNSUPPORTED;
    int state = g_isa.load();
    for (;;) {
        if (state >= 0 && (state & FIXED)) return (state & 0xff) == isa ? SET_ISA_OK : SET_ISA_FIXED;
        if (g_isa.compare_exchange_weak(state, isa)) return SET_ISA_OK;
    }
}

bool override_isa_unchecked(int isa) {
    if (!isa_supported(isa)) return false;
    int state = g_isa.load();
    while (!g_isa.compare_exchange_weak(state, isa | (state >= 0 ? state & FIXED : 0))) {
    }
    return true;
}

// The AVX2 build's FMA peak loop: 12 independent 8-lane accumulators (two fma pipes of
// latency 4-5 need 8-10), acc = acc * a + b with values that stay normal; returns the flops.
static double fma_loop_avx2(int64_t iterations) {
    __m256 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.001f * static_cast<float>(i));
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
    for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    alignas(32) float lanes[8];
    __m256 s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
    _mm256_store_ps(lanes, s);
    volatile float sink = lanes[0];
    (void)sink;
    return 2.0 * 8 * 12 * static_cast<double>(iterations);
}

double fma_peak_gflops(int64_t iterations, int repeats) {
    const bool wide = active_isa() == ISA_AVX512;
    const int64_t threads = std::max(1, at::get_num_threads());
    std::vector<double> flops(static_cast<size_t>(threads));
    double best = 0.0;
    for (int r = 0; r < std::max(1, repeats); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        // one chunk per thread: a worker that starts late leaves its chunk to the caller, which
        // then runs two in a row and this repeat reads low; the best repeat is the peak
        parallel_chunks(threads, 1, [&](int64_t b, int64_t e) {
            for (int64_t c = b; c < e; ++c)
                flops[c] = wide ? avx512::fma_loop(iterations) : fma_loop_avx2(iterations);
        }, 1);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double total = 0.0;
        for (double f : flops) total += f;
        best = std::max(best, total / seconds / 1e9);
    }
    return best;
}

bool int8_qtype_supported(int qtype) { return int8::qtype_supported(qtype); }

// The VNNI build runs under the AVX-512 one where the CPU has VNNI; the AVX2 build otherwise.
static bool int8_on_vnni(int isa) {
    static const bool vnni_here = vnni::cpu_supports();
    return vnni_here && isa == ISA_AVX512;
}

const char* int8_build() { return int8_on_vnni(active_isa()) ? "avx512-vnni" : "avx2"; }

void int8::columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1) {
    if (int8_on_vnni(fix_isa()))
        vnni::columns(p, x, qtype, c0, c1);
    else
        int8avx2::columns(p, x, qtype, c0, c1);
}

// A prefill of the interleaved formats through the build's tiles (qmatmul_vnni.h): packed once,
// split over threads by row chunks, then the threads split columns; false when not used.
static bool run_tiled(const TileFns& tiles_of, const Problem& p, const QuantRows& rows, int qtype) {
    if (!tiles_of.used(qtype, p.m)) return false;
    thread_local std::vector<uint8_t> buffer;
    const size_t bytes = static_cast<size_t>(tiles_of.bytes(p.m, p.k)) + 64;
    if (buffer.size() < bytes) buffer.resize(bytes);
    uint8_t* tiles = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
    parallel_chunks(tiles_of.chunks(p.m), 1, [&](int64_t b, int64_t e) { tiles_of.pack(rows, p.m, p.k, tiles, b, e); });
    decode_columns(p, [&](int64_t b, int64_t e) { tiles_of.columns(p, tiles, qtype, b, e); });
    return true;
}

// The int8-activation path: rows quantized once (split over threads by rows, each row's codes
// its own), then threads split columns as the decode path does.
static void run_int8(const Problem& p, int qtype) {
    thread_local RowBuffers buffers;
    const QuantRows rows = buffers.size_for(p.m, p.k);
    const int rounding = int8::rounding_of(qtype);
    parallel_chunks(p.m, std::max<int64_t>(1, 32768 / p.k),
                    [&](int64_t b, int64_t e) { int8::quantize_rows(p.x, b, e, p.k, rounding, rows); });
    static const TileFns vnni_tiles = vnni::tile_fns(), avx2_tiles = int8avx2::tile_fns();
    if (run_tiled(int8_on_vnni(fix_isa()) ? vnni_tiles : avx2_tiles, p, rows, qtype)) return;
    decode_columns(p, [&](int64_t b, int64_t e) { int8::columns(p, rows, qtype, b, e); });
}

void qmatmul_raw(const float* x, const uint8_t* w, float* out, int64_t m, int64_t n, int64_t k,
                 int64_t row_bytes, int qtype, bool int8_activations) {
    const Problem p{x, w, out, m, n, k, row_bytes};
    if (int8_activations && int8::qtype_supported(qtype)) {
        run_int8(p, qtype);
        return;
    }
    if (interleaved_source(qtype))
        throw std::invalid_argument("agentkv kernels: interleaved rows (qtype " + std::to_string(qtype) +
                                    ") need int8 activations");
    if (fix_isa() == ISA_AVX512) {
        int qk = 0, bytes = 0;
        if (!qtype_info(qtype, qk, bytes))
            throw std::invalid_argument("agentkv kernels: unsupported qtype " + std::to_string(qtype));
        run_avx512(p, qtype);
        return;
    }
    dispatch(qtype, [&](auto fmt) { run<typename formats_avx2::Matmul<decltype(fmt)>::type>(p); });
}

int interleaved_source(int qtype) {
    const int file = qtype - INTERLEAVED_OFFSET;
    return file == Q4_0 || file == Q4_1 || file == Q5_0 || file == Q8_0 || file == MXFP4 ? file : 0;
}

// The interleaved layout (qmatmul_vnni.h): per group of t <= 16 blocks, each header field of
// the t blocks (f16 d, m; MXFP4's one scale byte), for Q5_0 its fifth bits as eight step masks
// (a 4t-bit mask per 4-weight step s at bit 4ts: bit 4l + b is weight 4s + b of block l), then
// dword j of every block's codes for j = 0, 1, ... The same bytes per row as the file's form.
// `forward`: file -> interleaved, else back.
struct RowLayout {
    int block_bytes, fields, field_bytes;
    bool fifth;
};

static RowLayout layout_of(int file_qtype) {
    int qk = 0, bytes = 0;
    qtype_info(file_qtype, qk, bytes);
    return {bytes, file_qtype == Q4_1 ? 2 : 1, file_qtype == MXFP4 ? 1 : 2, file_qtype == Q5_0};
}

static void interleave_row(const uint8_t* src, uint8_t* dst, int64_t k, const RowLayout& f, bool forward) {
    const int64_t blocks = k / 32, fb = f.field_bytes, file_header = f.fields * fb + (f.fifth ? 4 : 0);
    const int64_t dwords = (f.block_bytes - file_header) / 4;
    for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
        const int64_t t = std::min<int64_t>(16, blocks - b0), masks = f.fields * fb * t, codes = file_header * t;
        const uint8_t* in = src + b0 * f.block_bytes;
        uint8_t* out = dst + b0 * f.block_bytes;
        if (f.fifth && forward) std::memset(out + masks, 0, 4 * t);
        for (int64_t l = 0; l < t; ++l) {
            const int64_t block = f.block_bytes * l;
            for (int64_t i = 0; i < f.fields; ++i) {
                const int64_t a = block + fb * i, x = fb * (t * i + l);
                std::memcpy(forward ? out + x : out + a, forward ? in + a : in + x, fb);
            }
            if (f.fifth) {
                const int64_t a = block + f.fields * fb;  // the file's u32 of fifth bits
                uint32_t qh = 0;
                if (forward) std::memcpy(&qh, in + a, 4);
                for (int64_t step = 0; step < 8; ++step) {
                    const int64_t bit = 4 * t * step + 4 * l;  // a multiple of 4: one nibble of a byte
                    if (forward)
                        out[masks + bit / 8] |= static_cast<uint8_t>(((qh >> (4 * step)) & 0xF) << (bit % 8));
                    else
                        qh |= static_cast<uint32_t>((in[masks + bit / 8] >> (bit % 8)) & 0xF) << (4 * step);
                }
                if (!forward) std::memcpy(out + a, &qh, 4);
            }
            for (int64_t j = 0; j < dwords; ++j) {
                const int64_t a = block + file_header + 4 * j, x = codes + 4 * (t * j + l);
                std::memcpy(forward ? out + x : out + a, forward ? in + a : in + x, 4);
            }
        }
    }
}

void interleave_rows(const uint8_t* src, uint8_t* dst, int64_t n, int64_t k, int file_qtype) {
    if (!interleaved_source(file_qtype + INTERLEAVED_OFFSET))
        throw std::invalid_argument("agentkv kernels: no interleaved form of qtype " + std::to_string(file_qtype));
    const RowLayout f = layout_of(file_qtype);
    const int64_t row_bytes = k / 32 * f.block_bytes;
    parallel_chunks(n, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) interleave_row(src + r * row_bytes, dst + r * row_bytes, k, f, true);
    });
}

void deinterleave_row(const uint8_t* src, uint8_t* dst, int64_t k, int qtype) {
    interleave_row(src, dst, k, layout_of(interleaved_source(qtype)), false);
}

void dequantize_raw(const uint8_t* w, float* out, int64_t n, int64_t k, int64_t row_bytes, int qtype) {
    if (const int file = interleaved_source(qtype)) {  // back to the file's order, a row at a time
        std::vector<uint8_t> row(row_bytes);
        for (int64_t r = 0; r < n; ++r) {
            deinterleave_row(w + r * row_bytes, row.data(), k, qtype);
            dequantize_raw(row.data(), out + r * k, 1, k, row_bytes, file);
        }
        return;
    }
    dispatch(qtype, [&](auto fmt) { dequant_rows<decltype(fmt)>(w, row_bytes, n, k, out); });
}

}  // namespace agentkv
