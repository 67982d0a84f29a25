// AVX-512 build of paged attention's unit: attention.cpp's range partial with 16 lanes and
// up to four query heads per pass (a whole Gemma-3 GQA group shares each K and V load).
//
// The order per (row, head, key range), which no other row, head or range can change:
//   1. acc[j] = fma chain over hd in 16-lane chunks of q * K[j], chunk 0 first (a masked last
//      chunk when hd is not a multiple of 16); score[j] = sum16(acc[j]) * scale, sum16 = the
//      low and high 8 lanes added, then reduce4's lane tree; softcap if asked;
//   2. m = max_j score[j];
//   3. e[j] = exp16(score[j] - m), 16 at a time;
//   4. l = hsum16 of the 16-lane accumulation of e over j in order (last chunk masked);
//   5. acc = sum_j e[j] * V[j] in key order, 16 lanes per chunk (divided by 1: stored as is).
// An f16 cache's K and V chunks are widened to f32 first (exact), then run this same order.
// The ranges of a row are merged in attention_ranges.cpp. Only the unit's work lives here
// (so nothing from the standard library is instantiated under the AVX-512 target).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "qmatmul_impl.h"

#include "attention_impl.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define AGENTKV_ISA isa_avx512
#include "simd512.h"

namespace agentkv {
namespace avx512 {
namespace {

constexpr int KEYS_AT_ONCE = 4;
constexpr int V_CHUNKS = 4;

// e^x for a score minus its row's max (x <= 0), 16 lanes: n = round(x log2 e); r = x - n ln 2
// in two fused steps (ln 2 as Cephes splits it); e^r by Cephes expf's polynomial; then
// vscalefps multiplies by 2^n, rounded once. 14 operations where simd.h's exp8 form (floor,
// separate products, 2^n built in the exponent bits) took 22; the AVX2 build keeps exp8 (its
// sums run in 8 lanes, so its bits were its own already).
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365447505531f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

static inline __mmask16 first_lanes(int64_t count) {
    return static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << count) - 1u);
}

// Chunk c (16 lanes) of a head vector; lanes past hd are zero.
static inline __m512 load_chunk(const float* v, int64_t c, int64_t full, __mmask16 tail) {
    return c < full ? _mm512_loadu_ps(v + 16 * c) : _mm512_maskz_loadu_ps(tail, v + 16 * c);
}

// Chunk c (16 lanes) of an f16 K or V row widened to f32 (exact); lanes past hd are zero.
static inline __m512 load_kv(const uint16_t* v, int64_t c, int64_t full, __mmask16 tail) {
    return _mm512_cvtph_ps(c < full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c))
                                    : _mm256_maskz_loadu_epi16(tail, v + 16 * c));
}

static inline __m512 load_kv(const float* v, int64_t c, int64_t full, __mmask16 tail) {
    return load_chunk(v, c, full, tail);
}

// Scores of NH query heads against keys [0, len); each step prefetches the K rows
// PREFETCH_KEYS ahead into L1 and the V rows of the same keys into L2 (a range's first keys
// before the loop), so the value pass after it waits on no DRAM.
template <typename KT, int NH, int CHUNKS>
static void scores(const AttentionArgs& a, const float* const* q, const int64_t* where, int64_t len,
                   float* const* out) {
    const int64_t chunks = CHUNKS ? CHUNKS : (a.hd + 15) / 16, full = CHUNKS ? CHUNKS : a.hd / 16;
    const __mmask16 tail = first_lanes(a.hd - 16 * full);
    const __m128 scale = _mm_set1_ps(a.scale);
    const KT* k_cache = KVRows<KT>::k(a);
    const KT* v_cache = KVRows<KT>::v(a);
    for (int64_t j = 0; j < PREFETCH_KEYS && j < len; ++j) {
        prefetch_span(k_cache + where[j], 0, a.hd);
        prefetch_span<KT, _MM_HINT_T1>(v_cache + where[j], 0, a.hd);
    }
    for (int64_t j = 0; j < len; j += KEYS_AT_ONCE) {
        for (int t = 0; t < KEYS_AT_ONCE; ++t) {
            prefetch_span(k_cache + where[j + PREFETCH_KEYS + t], 0, a.hd);
            prefetch_span<KT, _MM_HINT_T1>(v_cache + where[j + PREFETCH_KEYS + t], 0, a.hd);
        }
        __m512 acc[NH][KEYS_AT_ONCE];
        for (int hh = 0; hh < NH; ++hh)
            for (int t = 0; t < KEYS_AT_ONCE; ++t) acc[hh][t] = _mm512_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c) {
            __m512 qv[NH];
            for (int hh = 0; hh < NH; ++hh) qv[hh] = load_chunk(q[hh], c, full, tail);
            for (int t = 0; t < KEYS_AT_ONCE; ++t) {
                const __m512 kv = load_kv(k_cache + where[j + t], c, full, tail);
                for (int hh = 0; hh < NH; ++hh) acc[hh][t] = _mm512_fmadd_ps(qv[hh], kv, acc[hh][t]);
            }
        }
        for (int hh = 0; hh < NH; ++hh)
            _mm_storeu_ps(out[hh] + j, _mm_mul_ps(reduce4(acc[hh][0], acc[hh][1], acc[hh][2], acc[hh][3]), scale));
    }
    if (a.softcap > 0.0f)
        for (int hh = 0; hh < NH; ++hh)
            for (int64_t j = 0; j < len; ++j) out[hh][j] = a.softcap * std::tanh(out[hh][j] / a.softcap);
}

// With next_k (the one-query unit's first pass), key j also prefetches the K row of
// where[len + j] into L2: the next range's keys when this thread runs it next, so its score
// pass finds K near while this pass, which reads V from L2, leaves the memory bus free.
template <typename KT, int NH, int NB, int CHUNKS>
static void weighted_values(const AttentionArgs& a, const float* const* e, const int64_t* where, int64_t len,
                            int64_t c0, const float* sum, float* const* o, const KT* next_k = nullptr) {
    const int64_t full = CHUNKS ? CHUNKS : a.hd / 16;
    const __mmask16 tail = first_lanes(a.hd - 16 * full);
    const int64_t span = 16 * NB < a.hd - 16 * c0 ? 16 * NB : a.hd - 16 * c0;
    const KT* v_cache = KVRows<KT>::v(a);
    __m512 acc[NH][NB];
    for (int hh = 0; hh < NH; ++hh)
        for (int i = 0; i < NB; ++i) acc[hh][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
        prefetch_span(v_cache + where[j + PREFETCH_KEYS], 16 * c0, span);
        if (next_k != nullptr) prefetch_span<KT, _MM_HINT_T1>(next_k + where[len + j], 0, a.hd);
        const KT* v = v_cache + where[j];
        __m512 ej[NH];
        for (int hh = 0; hh < NH; ++hh) ej[hh] = _mm512_set1_ps(e[hh][j]);
        for (int i = 0; i < NB; ++i) {
            const __m512 vv = load_kv(v, c0 + i, full, tail);
            for (int hh = 0; hh < NH; ++hh) acc[hh][i] = _mm512_fmadd_ps(ej[hh], vv, acc[hh][i]);
        }
    }
    for (int hh = 0; hh < NH; ++hh) {
        const __m512 sv = _mm512_set1_ps(sum[hh]);
        for (int i = 0; i < NB; ++i) {
            const __m512 r = _mm512_div_ps(acc[hh][i], sv);
            if (c0 + i < full) _mm512_storeu_ps(o[hh] + 16 * (c0 + i), r);
            else _mm512_mask_storeu_ps(o[hh] + 16 * (c0 + i), tail, r);
        }
    }
}

template <typename KT, int NH, int CHUNKS>
static void weighted_values_any(const AttentionArgs& a, const float* const* e, const int64_t* where, int64_t len,
                                const float* sum, float* const* o) {
    const int64_t chunks = CHUNKS ? CHUNKS : (a.hd + 15) / 16;
    for (int64_t c0 = 0; c0 < chunks; c0 += V_CHUNKS) {
        // later keys, not copies of the last one (key_offsets' padding): prefetch their K
        const KT* next_k = c0 == 0 && where[len] != where[len - 1] ? KVRows<KT>::k(a) : nullptr;
        switch (chunks - c0 < V_CHUNKS ? chunks - c0 : V_CHUNKS) {
            case 4: weighted_values<KT, NH, 4, CHUNKS>(a, e, where, len, c0, sum, o, next_k); break;
            case 3: weighted_values<KT, NH, 3, CHUNKS>(a, e, where, len, c0, sum, o, next_k); break;
            case 2: weighted_values<KT, NH, 2, CHUNKS>(a, e, where, len, c0, sum, o, next_k); break;
            default: weighted_values<KT, NH, 1, CHUNKS>(a, e, where, len, c0, sum, o, next_k); break;
        }
    }
}

// Softmax weights in place over s[0 .. len) (padded to a multiple of 16); returns their sum
// and stores the max they are relative to in *max_out.
static float softmax_weights(float* s, int64_t len, float* max_out) {
    const int64_t padded = (len + 15) / 16 * 16;
    __m512 mxv = _mm512_set1_ps(s[0]);
    for (int64_t j = 0; j < padded; j += 16)
        mxv = _mm512_max_ps(mxv, _mm512_mask_loadu_ps(mxv, first_lanes(len - j), s + j));
    const float mx = _mm512_reduce_max_ps(mxv);  // max is exact: any order gives the same value
    *max_out = mx;
    const __m512 m = _mm512_set1_ps(mx);
    __m512 sumv = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
        const __mmask16 live = first_lanes(len - j);
        const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + j), m)));
        _mm512_storeu_ps(s + j, e);
        sumv = _mm512_add_ps(sumv, e);
    }
    return hsum16(sumv);
}

template <typename KT, int NH, int CHUNKS>
static void range_run(const AttentionArgs& a, const float* const* q, const int64_t* where, int64_t len, float* s,
                      float* m, float* l, float* const* acc) {
    const int64_t padded = (len + 15) / 16 * 16;
    float* sh[NH];
    float ones[NH];  // acc / 1 is acc exactly: the merge divides once, by the merged sum
    for (int hh = 0; hh < NH; ++hh) {
        sh[hh] = s + hh * padded;
        ones[hh] = 1.0f;
    }
    scores<KT, NH, CHUNKS>(a, q, where, len, sh);
    for (int hh = 0; hh < NH; ++hh) l[hh] = softmax_weights(sh[hh], len, m + hh);
    weighted_values_any<KT, NH, CHUNKS>(a, sh, where, len, ones, acc);
}

template <typename KT, int CHUNKS>
static void range_nh(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len,
                     float* s, float* m, float* l, float* const* acc) {
    switch (nh) {
        case 4: range_run<KT, 4, CHUNKS>(a, q, where, len, s, m, l, acc); break;
        case 3: range_run<KT, 3, CHUNKS>(a, q, where, len, s, m, l, acc); break;
        case 2: range_run<KT, 2, CHUNKS>(a, q, where, len, s, m, l, acc); break;
        default: range_run<KT, 1, CHUNKS>(a, q, where, len, s, m, l, acc); break;
    }
}

template <typename KT>
static void range_hd(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len,
                     float* s, float* m, float* l, float* const* acc) {
    switch (a.hd) {  // head sizes of real models, fully unrolled
        case 64: range_nh<KT, 4>(a, nh, q, where, len, s, m, l, acc); break;
        case 128: range_nh<KT, 8>(a, nh, q, where, len, s, m, l, acc); break;
        case 256: range_nh<KT, 16>(a, nh, q, where, len, s, m, l, acc); break;
        default: range_nh<KT, 0>(a, nh, q, where, len, s, m, l, acc); break;
    }
}

// Many queries of one kv head over the same keys (several rows of one sequence, each with
// its GQA heads): every query runs exactly range_run's order above (the same fma chain per
// key, reduce4 tree, scale, softcap, softmax_weights, and V accumulation in key order), so
// its bits are those it gets alone; only which queries share a load differs. Scores go 4
// keys at a time: the 4 K rows come from L2 once and feed every group of 4 queries from L1,
// whose 16 sums finish in one transposed reduction (reduce16). Values go NB chunks of every V
// row at a time for up to value_group<NB>() queries: a 64-wide head (SmolLM2's) in one pass of
// all 4 chunks, so each query's weight is broadcast once for 4 fmas instead of 2 (one SmolLM2
// chunk of 512 rows at 8,192 keys, 2 threads: 60.5 -> 57.5 ms); wider heads 2 chunks a pass,
// since 4 chunks of a range's 256 V rows are 32 KB, the whole L1 (Gemma-3's 256-wide heads
// went 92 -> 150 ms that way).
template <int NB>
constexpr int value_group() {  // queries per pass over NB chunks of V: at most 24 accumulators
    return NB >= 4 ? 6 : 12;
}

// [p.x | q.x] with v.x_i = v[i] + v[i + 8] (i < 8): the first step of reduce4's tree for two
// accumulators at once.
static inline __m512 add_halves(__m512 p, __m512 q) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
}

// Per 128-bit lane [b1[0] + b1[1], b1[2] + b1[3], b2[0] + b2[1], b2[2] + b2[3]]: the tree's
// next steps, pairs of neighbours.
static inline __m512 add_neighbours(__m512 b1, __m512 b2) {
    return _mm512_add_ps(_mm512_shuffle_ps(b1, b2, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(b1, b2, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The 16 sums of acc[qq][t] (4 queries x 4 keys) as lane 4 qq + t, each by reduce4's own tree
// (x_i = a[i] + a[i+8]; y_k = x_2k + x_2k+1; z = y0 + y1, y2 + y3; z0 + z1), in a transposed
// network: 15 shuffle pairs for 16 sums where four reduce4 calls take 44 shuffles.
static inline __m512 reduce16(const __m512 (&acc)[4][KEYS_AT_ONCE]) {
    __m512 d[2];
    for (int half = 0; half < 2; ++half) {
        const __m512(&a0)[KEYS_AT_ONCE] = acc[2 * half];
        const __m512(&a1)[KEYS_AT_ONCE] = acc[2 * half + 1];
        //   add_halves(a0[t], a1[t])  = [a0[t].x | a1[t].x]
        //   c1, c2 (keys 0-1, 2-3) lanes: [y0 y1 of a0[t], a0[t+1]], [y2 y3 of them], the same for a1
        //   d lanes: [z0 of a0 keys 0..3], [z1 of a0 keys 0..3], [z0 of a1 ...], [z1 of a1 ...]
        const __m512 c1 = add_neighbours(add_halves(a0[0], a1[0]), add_halves(a0[1], a1[1]));
        const __m512 c2 = add_neighbours(add_halves(a0[2], a1[2]), add_halves(a0[3], a1[3]));
        d[half] = add_neighbours(c1, c2);
    }
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

template <typename KT, int NQ, int CHUNKS>
static inline void score_block(const AttentionArgs& a, const float* const* q, const KT* const* k, float* const* out,
                               int64_t j) {
    const int64_t chunks = CHUNKS ? CHUNKS : (a.hd + 15) / 16, full = CHUNKS ? CHUNKS : a.hd / 16;
    const __mmask16 tail = first_lanes(a.hd - 16 * full);
    __m512 acc[NQ][KEYS_AT_ONCE];
    for (int qq = 0; qq < NQ; ++qq)
        for (int t = 0; t < KEYS_AT_ONCE; ++t) acc[qq][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
        __m512 kv[KEYS_AT_ONCE];
        for (int t = 0; t < KEYS_AT_ONCE; ++t) kv[t] = load_kv(k[t], c, full, tail);
        for (int qq = 0; qq < NQ; ++qq) {
            const __m512 qv = load_chunk(q[qq], c, full, tail);
            for (int t = 0; t < KEYS_AT_ONCE; ++t) acc[qq][t] = _mm512_fmadd_ps(qv, kv[t], acc[qq][t]);
        }
    }
    if constexpr (NQ >= 3) {  // 3 queries: the 4th sums of the transposed tree are zeros, never stored
        __m512 all[4][KEYS_AT_ONCE];
        for (int qq = 0; qq < 4; ++qq)
            for (int t = 0; t < KEYS_AT_ONCE; ++t) all[qq][t] = qq < NQ ? acc[qq][t] : _mm512_setzero_ps();
        const __m512 sums = _mm512_mul_ps(reduce16(all), _mm512_set1_ps(a.scale));
        _mm_storeu_ps(out[0] + j, _mm512_castps512_ps128(sums));
        _mm_storeu_ps(out[1] + j, _mm512_extractf32x4_ps(sums, 1));
        _mm_storeu_ps(out[2] + j, _mm512_extractf32x4_ps(sums, 2));
        if constexpr (NQ == 4) _mm_storeu_ps(out[3] + j, _mm512_extractf32x4_ps(sums, 3));
    } else {
        const __m128 scale = _mm_set1_ps(a.scale);
        for (int qq = 0; qq < NQ; ++qq)
            _mm_storeu_ps(out[qq] + j, _mm_mul_ps(reduce4(acc[qq][0], acc[qq][1], acc[qq][2], acc[qq][3]), scale));
    }
}

// The 4 K rows of a step as every query group reads them: as they are (f32, or f16 past
// MAX_HD), or f16 widened to f32 once into `rows` (exact), so each group of 4 queries loads
// them instead of widening them again: 12 times a chunk for SmolLM2's 48 queries, each two
// micro-ops on the FMA ports. 192 rows over 3,192 keys, one thread, A/B in one session:
// SmolLM2's shape 19.9 -> 18.7 ms, Gemma-3's 27.0 -> 23.8 ms.
constexpr int64_t MAX_HD = 256;  // the widest head widened (Gemma-3's 256)

template <typename KT>
static inline void step_rows(const AttentionArgs&, const KT* const* k, float*, const KT** out) {
    for (int t = 0; t < KEYS_AT_ONCE; ++t) out[t] = k[t];
}

static inline void step_rows(const AttentionArgs& a, const uint16_t* const* k, float* rows, const float** out) {
    const int64_t chunks = (a.hd + 15) / 16, full = a.hd / 16;
    const __mmask16 tail = first_lanes(a.hd - 16 * full);
    for (int t = 0; t < KEYS_AT_ONCE; ++t) {
        float* row = rows + t * 16 * chunks;
        for (int64_t c = 0; c < chunks; ++c) _mm512_store_ps(row + 16 * c, load_kv(k[t], c, full, tail));
        out[t] = row;
    }
}

template <typename KT, typename RT, int CHUNKS>
static void scores_many_of(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                           float* const* out) {
    const KT* k_cache = KVRows<KT>::k(a);
    alignas(64) float rows[KEYS_AT_ONCE * MAX_HD];
    for (int64_t j = 0; j < len; j += KEYS_AT_ONCE) {
        const KT* k[KEYS_AT_ONCE];
        for (int t = 0; t < KEYS_AT_ONCE; ++t) {
            prefetch_span(k_cache + where[j + PREFETCH_KEYS + t], 0, a.hd);
            k[t] = k_cache + where[j + t];
        }
        const RT* kr[KEYS_AT_ONCE];
        step_rows(a, k, rows, kr);
        for (int g = 0; g < nq;) {
            switch (nq - g >= 4 ? 4 : nq - g) {
                case 4: score_block<RT, 4, CHUNKS>(a, q + g, kr, out + g, j); g += 4; break;
                case 3: score_block<RT, 3, CHUNKS>(a, q + g, kr, out + g, j); g += 3; break;
                case 2: score_block<RT, 2, CHUNKS>(a, q + g, kr, out + g, j); g += 2; break;
                default: score_block<RT, 1, CHUNKS>(a, q + g, kr, out + g, j); g += 1; break;
            }
        }
    }
}

template <typename KT, int CHUNKS>
static void scores_many(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                        float* const* out) {
    if (a.hd <= MAX_HD) scores_many_of<KT, float, CHUNKS>(a, nq, q, where, len, out);
    else scores_many_of<KT, KT, CHUNKS>(a, nq, q, where, len, out);
    if (a.softcap > 0.0f)
        for (int qq = 0; qq < nq; ++qq)
            for (int64_t j = 0; j < len; ++j) out[qq][j] = a.softcap * std::tanh(out[qq][j] / a.softcap);
}

// o[qq][chunks c0 .. c0+NB) = sum_j e[qq][j] * V[j], keys in order (weighted_values' fma per
// lane; stored undivided, as range_run's division by 1 leaves it).
template <typename KT, int NQ, int NB, int CHUNKS>
static void value_block(const AttentionArgs& a, const float* const* e, const int64_t* where, int64_t len, int64_t c0,
                        float* const* o) {
    const int64_t full = CHUNKS ? CHUNKS : a.hd / 16;
    const __mmask16 tail = first_lanes(a.hd - 16 * full);
    const int64_t span = 16 * NB < a.hd - 16 * c0 ? 16 * NB : a.hd - 16 * c0;
    const KT* v_cache = KVRows<KT>::v(a);
    __m512 acc[NQ][NB];
    for (int qq = 0; qq < NQ; ++qq)
        for (int i = 0; i < NB; ++i) acc[qq][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
        prefetch_span(v_cache + where[j + PREFETCH_KEYS], 16 * c0, span);
        const KT* v = v_cache + where[j];
        __m512 vv[NB];
        for (int i = 0; i < NB; ++i) vv[i] = load_kv(v, c0 + i, full, tail);
        for (int qq = 0; qq < NQ; ++qq) {
            const __m512 ej = _mm512_set1_ps(e[qq][j]);
            for (int i = 0; i < NB; ++i) acc[qq][i] = _mm512_fmadd_ps(ej, vv[i], acc[qq][i]);
        }
    }
    for (int qq = 0; qq < NQ; ++qq)
        for (int i = 0; i < NB; ++i) {
            if (c0 + i < full) _mm512_storeu_ps(o[qq] + 16 * (c0 + i), acc[qq][i]);
            else _mm512_mask_storeu_ps(o[qq] + 16 * (c0 + i), tail, acc[qq][i]);
        }
}

template <typename KT, int NB, int CHUNKS>
static void values_nb(const AttentionArgs& a, int nq, const float* const* e, const int64_t* where, int64_t len,
                      int64_t c0, float* const* o) {
    constexpr int GROUP = value_group<NB>();
    for (int g = 0; g < nq;) {
        const int left = nq - g;
        if (left >= GROUP) {
            value_block<KT, GROUP, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += GROUP;
        } else if (GROUP > 8 && left >= 8) {
            value_block<KT, 8, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += 8;
        } else if (left >= 4) {
            value_block<KT, 4, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += 4;
        } else if (left == 3) {
            value_block<KT, 3, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += 3;
        } else if (left >= 2) {
            value_block<KT, 2, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += 2;
        } else {
            value_block<KT, 1, NB, CHUNKS>(a, e + g, where, len, c0, o + g);
            g += 1;
        }
    }
}

template <typename KT, int CHUNKS>
static void range_many(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                       float* s, float* m, float* l, float* const* acc) {
    const int64_t padded = (len + 15) / 16 * 16, chunks = CHUNKS ? CHUNKS : (a.hd + 15) / 16;
    float* sh[MAX_QUERIES];
    for (int qq = 0; qq < nq; ++qq) sh[qq] = s + qq * padded;
    scores_many<KT, CHUNKS>(a, nq, q, where, len, sh);
    for (int qq = 0; qq < nq; ++qq) l[qq] = softmax_weights(sh[qq], len, m + qq);
    if constexpr (CHUNKS == 4) {
        values_nb<KT, 4, CHUNKS>(a, nq, sh, where, len, 0, acc);
        return;
    }
    for (int64_t c0 = 0; c0 < chunks; c0 += 2) {
        if (chunks - c0 >= 2) values_nb<KT, 2, CHUNKS>(a, nq, sh, where, len, c0, acc);
        else values_nb<KT, 1, CHUNKS>(a, nq, sh, where, len, c0, acc);
    }
}

template <typename KT>
static void range_many_hd(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                          float* s, float* m, float* l, float* const* acc) {
    switch (a.hd) {
        case 64: range_many<KT, 4>(a, nq, q, where, len, s, m, l, acc); break;
        case 128: range_many<KT, 8>(a, nq, q, where, len, s, m, l, acc); break;
        case 256: range_many<KT, 16>(a, nq, q, where, len, s, m, l, acc); break;
        default: range_many<KT, 0>(a, nq, q, where, len, s, m, l, acc); break;
    }
}

}  // namespace

void attend_range_many(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                       float* s, float* m, float* l, float* const* acc) {
    if (a.k_half != nullptr) {
        range_many_hd<uint16_t>(a, nq, q, where, len, s, m, l, acc);
    } else {
        range_many_hd<float>(a, nq, q, where, len, s, m, l, acc);
    }
}

void attend_range(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len,
                  float* s, float* m, float* l, float* const* acc) {
    if (a.k_half != nullptr) {  // f16 K/V: the same unit, only the loads differ
        range_hd<uint16_t>(a, nh, q, where, len, s, m, l, acc);
    } else {
        range_hd<float>(a, nh, q, where, len, s, m, l, acc);
    }
}

}  // namespace avx512
}  // namespace agentkv

#pragma GCC pop_options
