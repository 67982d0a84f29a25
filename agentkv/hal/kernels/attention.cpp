// Paged causal attention over an f32 KV cache, one (query row, head) at a time.
//
// Every (row, head) walks its own keys start..pos in the same fixed order whatever else is
// in the call, so a decode row (n = 1) and the same row inside a chunked prefill give the
// same bits. The order, per (row, head):
//
//   1. score[j] = hsum8(fma chain over hd in 8-lane chunks of q * K[start + j]) * scale,
//      then softcap * tanh(score / softcap) when softcap > 0;
//   2. mx = max_j score[j] (exact, order-free);
//   3. e[j] = exp8(score[j] - mx) for all j, 8 at a time (one exp code path, no scalar tail);
//   4. sum = hsum8(8-lane accumulation of e over j in order, the last chunk masked);
//   5. o = sum_j e[j] * V[start + j] accumulated in key order (one fma per lane), o / sum.
//
// Key position p of sequence s lives in block block_tables[s][p / block_size] at offset
// p % block_size:
//
//   keys      0 ........ start ............ pos      (start = pos - window + 1 if window)
//                        |<---- attended ---->|
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "qmatmul.h"
#include "simd.h"

namespace agentkv {
namespace {

constexpr int KEYS_AT_ONCE = 4;  // independent dot products in flight (same per-key order)
constexpr int V_CHUNKS = 8;      // output chunks held in registers per pass over the keys
constexpr int HEADS_AT_ONCE = 3; // query heads of one kv head scored together (GQA)

// Per-thread scratch, reused across (row, head) pairs.
struct Scratch {
    std::vector<float> s;        // per head: scores, then exp weights; padded to a multiple of 8
    std::vector<int64_t> where;  // element offset of key start + j in the caches
};

// Offsets of keys start..start+len-1 for one kv head: a block-table walk without a
// division per key.
static void key_offsets(const AttentionArgs& a, const int32_t* table, int64_t kv, int64_t start,
                        int64_t len, int64_t* where) {
    int64_t b = start / a.block_size, off = start % a.block_size;
    for (int64_t j = 0; j < len; ++j) {
        where[j] = ((static_cast<int64_t>(table[b]) * a.block_size + off) * a.kvh + kv) * a.hd;
        if (++off == a.block_size) {
            off = 0;
            ++b;
        }
    }
}

// Loads chunk c (8 lanes) of a head vector, masking lanes past hd.
static inline __m256 load_chunk(const float* v, int64_t c, int64_t full, __m256i tail) {
    return c < full ? _mm256_loadu_ps(v + 8 * c) : _mm256_maskload_ps(v + 8 * c, tail);
}

// Scores of NH query heads (sharing one kv head) against NK keys: each K chunk is loaded
// once for all heads; each (head, key) still runs its own fma chain over hd in order.
template <int NH, int NK>
static void scores_block(const AttentionArgs& a, const float* const* q, const int64_t* where, float* const* out,
                         int64_t j) {
    const int64_t chunks = (a.hd + 7) / 8, full = a.hd / 8;
    const __m256i tail = lane_mask(static_cast<int>(a.hd - 8 * full));
    __m256 acc[NH][NK];
    for (int hh = 0; hh < NH; ++hh)
        for (int t = 0; t < NK; ++t) acc[hh][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
        __m256 kv[NK];
        for (int t = 0; t < NK; ++t) kv[t] = load_chunk(a.k_cache + where[j + t], c, full, tail);
        for (int hh = 0; hh < NH; ++hh) {
            const __m256 qv = load_chunk(q[hh], c, full, tail);
            for (int t = 0; t < NK; ++t) acc[hh][t] = _mm256_fmadd_ps(qv, kv[t], acc[hh][t]);
        }
    }
    for (int hh = 0; hh < NH; ++hh)
        for (int t = 0; t < NK; ++t) {
            float s = hsum8(acc[hh][t]) * a.scale;
            if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
            out[hh][j + t] = s;
        }
}

template <int NH>
static void scores(const AttentionArgs& a, const float* const* q, const int64_t* where, int64_t len,
                   float* const* out) {
    int64_t j = 0;
    for (; j + KEYS_AT_ONCE <= len; j += KEYS_AT_ONCE) scores_block<NH, KEYS_AT_ONCE>(a, q, where, out, j);
    for (; j < len; ++j) scores_block<NH, 1>(a, q, where, out, j);
}

// o[c0 .. c0+NB chunks) = (sum_j e[j] * V[j]) / sum, keys in order, accumulators in registers.
template <int NB>
static void weighted_values(const AttentionArgs& a, const float* e, const int64_t* where, int64_t len,
                            int64_t c0, float sum, float* o) {
    const int64_t full = a.hd / 8;
    const __m256i tail = lane_mask(static_cast<int>(a.hd - 8 * full));
    __m256 acc[NB];
    for (int i = 0; i < NB; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
        const __m256 ej = _mm256_set1_ps(e[j]);
        const float* v = a.v_cache + where[j];
        for (int i = 0; i < NB; ++i) acc[i] = _mm256_fmadd_ps(ej, load_chunk(v, c0 + i, full, tail), acc[i]);
    }
    const __m256 sv = _mm256_set1_ps(sum);
    for (int i = 0; i < NB; ++i) {
        const __m256 r = _mm256_div_ps(acc[i], sv);
        if (c0 + i < full) _mm256_storeu_ps(o + 8 * (c0 + i), r);
        else _mm256_maskstore_ps(o + 8 * (c0 + i), tail, r);
    }
}

static void weighted_values_any(const AttentionArgs& a, const float* e, const int64_t* where, int64_t len,
                                int64_t c0, int nb, float sum, float* o) {
    switch (nb) {
        case 8: weighted_values<8>(a, e, where, len, c0, sum, o); break;
        case 7: weighted_values<7>(a, e, where, len, c0, sum, o); break;
        case 6: weighted_values<6>(a, e, where, len, c0, sum, o); break;
        case 5: weighted_values<5>(a, e, where, len, c0, sum, o); break;
        case 4: weighted_values<4>(a, e, where, len, c0, sum, o); break;
        case 3: weighted_values<3>(a, e, where, len, c0, sum, o); break;
        case 2: weighted_values<2>(a, e, where, len, c0, sum, o); break;
        default: weighted_values<1>(a, e, where, len, c0, sum, o); break;
    }
}

// Softmax weights in place over s[0 .. len) (padded to a multiple of 8); returns their sum.
static float softmax_weights(float* s, int64_t len) {
    const int64_t padded = (len + 7) / 8 * 8;
    float mx = s[0];
    for (int64_t j = 1; j < len; ++j) mx = std::max(mx, s[j]);
    for (int64_t j = len; j < padded; ++j) s[j] = mx;  // lanes computed but never summed
    const __m256 mxv = _mm256_set1_ps(mx);
    __m256 sumv = _mm256_setzero_ps();
    for (int64_t j = 0; j < padded; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mxv));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(lane_mask(static_cast<int>(std::min<int64_t>(8, len - j)))));
        _mm256_storeu_ps(s + j, e);
        sumv = _mm256_add_ps(sumv, e);
    }
    return hsum8(sumv);
}

// Query heads h0 .. h0+nh-1 of one row, all reading kv head `kv` (nh <= HEADS_AT_ONCE).
static void attend_heads(const AttentionArgs& a, int64_t row, int64_t kv, int64_t h0, int nh, Scratch& scratch) {
    const int64_t pos = a.row_pos[row];
    const int64_t start = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    const int64_t len = pos - start + 1;
    const int64_t padded = (len + 7) / 8 * 8;
    if (static_cast<int64_t>(scratch.where.size()) < padded) {
        scratch.s.resize(HEADS_AT_ONCE * padded);
        scratch.where.resize(padded);
    }
    int64_t* where = scratch.where.data();
    key_offsets(a, a.block_tables + a.row_seq[row] * a.max_blocks_per_seq, kv, start, len, where);
    const float* q[HEADS_AT_ONCE];
    float* s[HEADS_AT_ONCE];
    for (int hh = 0; hh < nh; ++hh) {
        q[hh] = a.q + (row * a.h + h0 + hh) * a.hd;
        s[hh] = scratch.s.data() + hh * padded;
    }
    switch (nh) {
        case 3: scores<3>(a, q, where, len, s); break;
        case 2: scores<2>(a, q, where, len, s); break;
        default: scores<1>(a, q, where, len, s); break;
    }
    const int64_t chunks = (a.hd + 7) / 8;
    for (int hh = 0; hh < nh; ++hh) {
        const float sum = softmax_weights(s[hh], len);
        float* o = a.out + (row * a.h + h0 + hh) * a.hd;
        for (int64_t c0 = 0; c0 < chunks; c0 += V_CHUNKS)
            weighted_values_any(a, s[hh], where, len, c0,
                                static_cast<int>(std::min<int64_t>(V_CHUNKS, chunks - c0)), sum, o);
    }
}

}  // namespace

// Work unit: (row, kv head, a run of up to HEADS_AT_ONCE of its query heads, runs of equal
// size: 4 heads go 2 + 2, not 3 + 1, so a decode call's two units balance over two threads).
// Threads split units only; every (row, head) result is computed the same way in whichever
// unit it sits (a head's fma chains never depend on its neighbours).
void paged_attention_raw(const AttentionArgs& a) {
    const int64_t group = a.h / a.kvh;
    const int64_t runs = (group + HEADS_AT_ONCE - 1) / HEADS_AT_ONCE;
    const int64_t per_run = (group + runs - 1) / runs;
    at::parallel_for(0, a.n * a.kvh * runs, 1, [&](int64_t b, int64_t e) {
        Scratch scratch;
        for (int64_t i = b; i < e; ++i) {
            const int64_t row = i / (a.kvh * runs), kv = (i / runs) % a.kvh, r = i % runs;
            const int64_t h0 = kv * group + r * per_run;
            const int nh = static_cast<int>(std::min<int64_t>(per_run, group - r * per_run));
            attend_heads(a, row, kv, h0, nh, scratch);
        }
    });
}

}  // namespace agentkv
