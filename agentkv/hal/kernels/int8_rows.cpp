// The one rounding of activations to int8 for both builds of the int8-activation matmul
// (qmatmul_vnni.cpp, qmatmul_int8.cpp), in AVX2: a row's codes, scales and sums, as
// qmatmul_vnni.h's QuantRows lays them out. Rounding is exact arithmetic on the row alone
// (a max, one f32 multiply and a round-half-even per value, integer sums), so a row's codes
// never depend on the rows beside it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qmatmul_vnni.h"
#include "simd.h"

namespace agentkv {
namespace int8 {
namespace {

// The 4-sums of 32 codes as 8 int32 lanes (u8 ones x s8 codes; no int16 pair leaves range).
static inline __m256i four_sums(__m256i codes) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), codes), _mm256_set1_epi16(1));
}

// 32 values -> int8 codes of x * id (round half even, saturated), in k order.
static inline __m256i codes32(const float* x, __m256 id) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), id));
    // the packs interleave 4-value groups per 128-bit lane: [v0 lo, v1 lo, v2 lo, v3 lo | v0 hi, ...]
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One rounded 32-wide block at slot `at` of the row: its codes and per lane d (store_codes),
// and per lane -off * 4-sum and d * 4-sum (store_block).
static inline void store_codes(__m256i codes, float d, int64_t at, const QuantRows& out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + 32 * at), codes);
    _mm256_storeu_ps(out.dx + 8 * at, _mm256_set1_ps(d));
}

static inline void store_block(__m256i codes, float d, int off, int64_t at, const QuantRows& out) {
    store_codes(codes, d, at, out);
    const __m256i sums = four_sums(codes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.init + 8 * at), _mm256_mullo_epi32(sums, _mm256_set1_epi32(-off)));
    _mm256_storeu_ps(out.xs + 8 * at, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums)));
}

static inline float amax(const float* x, int64_t n) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(abs, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55)));
}

// Block b of a row rounded 32 wide: its codes and d (zero past k).
static inline __m256i block32(const float* xr, int64_t k, int64_t b, float& d) {
    d = 0.0f;
    if (32 * b >= k) return _mm256_setzero_si256();
    d = amax(xr + 32 * b, 32) / 127.0f;
    return codes32(xr + 32 * b, _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f));
}

// A row (out: its own QuantRows) in 32-wide rounding blocks, up to the kernels' last pair of
// blocks (an odd last block's partner zero).
static void quantize_row32(const float* xr, int64_t k, int off, const QuantRows& out) {
    for (int64_t b = 0; b < (k + 63) / 64 * 2; ++b) {
        float d;
        const __m256i codes = block32(xr, k, b, d);
        store_block(codes, d, off, b, out);
    }
}

// A row in 32-wide rounding blocks for the interleaved kernels (ROUND 3): the codes of block
// b = 16 gi + l go out as 8 dwords at 512 gi + 64 s + 4 l; init, dx and xs one per block.
static void quantize_row_x16(const float* xr, int64_t k, int off, const QuantRows& out) {
    for (int64_t b = 0; b < out.ld_q / 32; ++b) {
        float d;
        const __m256i codes = block32(xr, k, b, d);
        alignas(32) int32_t words[8], sums[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(words), codes);
        _mm256_store_si256(reinterpret_cast<__m256i*>(sums), four_sums(codes));
        int8_t* group = out.q + 512 * (b / 16) + 4 * (b % 16);
        for (int step = 0; step < 8; ++step) std::memcpy(group + 64 * step, &words[step], 4);
        const int32_t sum = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
        out.init[b] = -off * sum;
        out.dx[b] = d;
        out.xs[b] = d * static_cast<float>(sum);
    }
}

// A row of a K-quant's k (a multiple of 256) in 256-wide rounding blocks; block j of each
// super-block goes to slot SLOT[j] (Q4_K's order when `q4k`, else k order), sub[j] is d * the
// sum of its codes and gsum its two 16-wide halves' sums (the K-quant kernels read no init or xs).
static void quantize_row256(const float* xr, int64_t k, bool q4k, const QuantRows& out) {
    constexpr int Q4K_SLOT[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int64_t s = 0; s < k / 256; ++s) {
        const float d = amax(xr + 256 * s, 256) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        for (int j = 0; j < 8; ++j) {
            const __m256i codes = codes32(xr + 256 * s + 32 * j, id);
            store_codes(codes, d, 8 * s + (q4k ? Q4K_SLOT[j] : j), out);
            alignas(32) int32_t sums[8];  // lanes 0..3: group 2j, 4..7: group 2j + 1
            _mm256_store_si256(reinterpret_cast<__m256i*>(sums), four_sums(codes));
            const int32_t a = (sums[0] + sums[1]) + (sums[2] + sums[3]), b = (sums[4] + sums[5]) + (sums[6] + sums[7]);
            out.gsum[16 * s + 2 * j] = static_cast<int16_t>(a);
            out.gsum[16 * s + 2 * j + 1] = static_cast<int16_t>(b);
            out.sub[8 * s + j] = d * static_cast<float>(a + b);
        }
    }
}

}  // namespace

void quantize_rows(const float* x, int64_t r0, int64_t r1, int64_t k, int rounding, const QuantRows& out) {
    const int off = rounding / 4, round = rounding % 4;
    for (int64_t r = r0; r < r1; ++r) {
        if (round == 0)
            quantize_row32(x + r * k, k, off, out.offset(r));
        else if (round == 3)
            quantize_row_x16(x + r * k, k, off, out.offset(r));
        else
            quantize_row256(x + r * k, k, round == 2, out.offset(r));
    }
}

}  // namespace int8
}  // namespace agentkv
