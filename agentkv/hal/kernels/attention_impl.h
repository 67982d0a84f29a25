// What paged attention's driver (attention_ranges.cpp: tiles, ranges, threads, the merge)
// shares with the per-ISA units (attention.cpp for AVX2, attention512.cpp for AVX-512).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "qmatmul.h"

namespace agentkv {

// Keys are cut into ranges at absolute key indices that are multiples of KEY_RANGE:
//
//   keys   0 ..... 255 | 256 ..... 511 | 512 .. pos        (KEY_RANGE = 256)
//   row    start=0 ... ranges 0, 1, 2 (the last one partial), merged 0, 1, 2 in that order
//
// Where a range boundary falls depends only on the row's own start and position, never on
// the batch, the tile or the thread count, so a decode row split over threads and the same
// row inside a chunked prefill run the same arithmetic. A row of <= KEY_RANGE keys (one
// range) keeps the single-pass bits: the merge of one range is the identity.
constexpr int64_t KEY_RANGE = 256;
// where[] entries past a range's last key that a unit may read: real later keys or copies of
// the last offset. The one-query unit's value pass reads as many entries past its keys as it
// has keys, and prefetches those K rows (the next range's, when the same thread runs it next);
// the other reads stay within 4-key steps rounded up to 16 lanes, then PREFETCH_KEYS ahead.
constexpr int64_t RANGE_PAD = KEY_RANGE + 48;
// Elements [first, first + count) of a K or V cache row into the caches (HINT: _MM_HINT_T0
// for L1, _MM_HINT_T1 for L2), one touch per 64-byte line; both ISAs' units use it.
template <typename T, int HINT = _MM_HINT_T0>
static inline void prefetch_span(const T* row, int64_t first, int64_t count) {
    constexpr int64_t line = 64 / sizeof(T);
    for (int64_t i = first; i < first + count; i += line)
        _mm_prefetch(reinterpret_cast<const char*>(row + i), static_cast<_mm_hint>(HINT));
    _mm_prefetch(reinterpret_cast<const char*>(row + first + count - 1), static_cast<_mm_hint>(HINT));
}
// Scratch floats a unit needs for its scores: up to 4 heads of a range padded to 16.
constexpr int64_t RANGE_SCRATCH_FLOATS = 4 * (KEY_RANGE + 16);

// The K/V element type a unit reads: float (f32 cache) or uint16_t (IEEE f16 bits, widened
// to f32 in registers by an exact conversion, after which every operation is the f32 one).
template <typename KT>
struct KVRows;
template <>
struct KVRows<float> {
    static const float* k(const AttentionArgs& a) { return a.k_cache; }
    static const float* v(const AttentionArgs& a) { return a.v_cache; }
};
template <>
struct KVRows<uint16_t> {
    static const uint16_t* k(const AttentionArgs& a) { return a.k_half; }
    static const uint16_t* v(const AttentionArgs& a) { return a.v_half; }
};

// One unit: query heads q[0 .. nh) (nh <= the ISA's HEADS_AT_ONCE, one kv head) over `len`
// (1 .. KEY_RANGE) keys at element offsets `where` (RANGE_PAD readable entries past len).
// Writes, per head hh: m[hh] = the max score, l[hh] = sum_j exp(score_j - m[hh]) and
// acc[hh][0 .. hd) = sum_j exp(score_j - m[hh]) * V[j], keys in order (not divided).
// `s` is RANGE_SCRATCH_FLOATS of scratch.
using RangeUnit = void (*)(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len,
                           float* s, float* m, float* l, float* const* acc);

// Queries per call of a many-query unit: up to 16 rows (the driver's tile) times a run of heads.
constexpr int MAX_QUERIES = 64;

// attend_range_many, each ISA's: the unit for nq (1 .. MAX_QUERIES) queries of one kv head
// that attend the same keys (several rows of one sequence whose range is the same, or rows
// of sequences whose range lies in the same blocks, each with its heads). Per query the same
// arithmetic, so the same bits, as attend_range gives it alone; only the loads are shared.
// `s` holds nq * (KEY_RANGE + 16) floats.
namespace avx2 {
constexpr int HEADS_AT_ONCE = 3;
void attend_range(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len, float* s,
                  float* m, float* l, float* const* acc);
void attend_range_many(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                       float* s, float* m, float* l, float* const* acc);
}  // namespace avx2

namespace avx512 {
void attend_range_many(const AttentionArgs& a, int nq, const float* const* q, const int64_t* where, int64_t len,
                       float* s, float* m, float* l, float* const* acc);
void attend_range(const AttentionArgs& a, int nh, const float* const* q, const int64_t* where, int64_t len, float* s,
                  float* m, float* l, float* const* acc);
}  // namespace avx512

}  // namespace agentkv
