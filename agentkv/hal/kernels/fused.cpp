// Fused glue kernels: RMSNorm, residual add + norm, gated activations and the attention
// inputs (split, q/k norm, rope, K/V store, f32 or rounded to f16). They replace ~40 small
// torch ops per layer.
//
// Batch invariance: each row (token) is computed alone, in one fixed order, and threads
// split rows only. The one reduction, a row's sum of squares, runs
//
//   acc (8 lanes) += x[8c .. 8c+8)^2 for chunks c = 0, 1, ... in column order,
//                    the last partial chunk masked to zeros;  ss = hsum8(acc)
//
// so its bits depend on the row's values and width alone. Tails are by column position
// (the same for every row); every element of one kind goes through the same instructions.
// Arithmetic mirrors the torch backend's expressions op for op (the build passes
// -ffp-contract=off, and only the explicit fma inside exp8 fuses).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fused.h"
#include "pool.h"
#include "simd.h"

namespace agentkv {
namespace {

constexpr int64_t GRAIN_FLOATS = 16384;  // rows per thread chunk ~ this many floats: decode stays inline

int64_t grain_rows(int64_t width) { return std::max<int64_t>(1, GRAIN_FLOATS / std::max<int64_t>(1, width)); }

// 8 floats at p with `left` floats remaining in the row; lanes past the row read as 0.
inline __m256 load8(const float* p, int64_t left) {
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(static_cast<int>(left)));
}

inline void store8(float* p, __m256 v, int64_t left) {
    if (left >= 8) {
        _mm256_storeu_ps(p, v);
    } else {
        _mm256_maskstore_ps(p, lane_mask(static_cast<int>(left)), v);
    }
}

// sqrt(mean(x^2) + eps) of one row, in the order described at the top of this file.
inline float rms_of(const float* x, int64_t d, float eps) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8) {
        const __m256 v = load8(x + j, d - j);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    return std::sqrt(hsum8(acc) / static_cast<float>(d) + eps);
}

inline __m256 gain8(const float* w, int64_t left, bool unit_offset) {
    const __m256 g = load8(w, left);
    return unit_offset ? _mm256_add_ps(_mm256_set1_ps(1.0f), g) : g;
}

// out = (x / rms) * gain for one row; out may alias x.
inline void norm_row(const float* x, const float* w, float* out, int64_t d, float eps, bool unit_offset) {
    const __m256 s = _mm256_set1_ps(rms_of(x, d, eps));
    for (int64_t j = 0; j < d; j += 8) {
        const __m256 v = _mm256_div_ps(load8(x + j, d - j), s);
        store8(out + j, _mm256_mul_ps(v, gain8(w + j, d - j, unit_offset)), d - j);
    }
}

// act(g) * u, 8 lanes. silu(g) = g / (1 + exp(-g)) as the torch backend writes it.
// gelu_tanh(g) = 0.5 g (1 + tanh(y)), y = c (g + 0.044715 g^3), is computed through the
// identity 0.5 (1 + tanh(y)) = 1 / (1 + exp(-2y)): g / (1 + exp(-2y)). Same function, one
// exp8 and no cancellation where tanh(y) is near -1 (the direct form loses digits there).
inline __m256 glu8(__m256 g, __m256 u, int kind) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 e;
    if (kind == GLU_SILU) {
        e = exp8(_mm256_xor_ps(g, sign));
    } else {
        const __m256 c = _mm256_set1_ps(0.7978845608028654f);  // sqrt(2 / pi)
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), g), g);
        const __m256 y = _mm256_mul_ps(c, _mm256_add_ps(g, cube));
        e = exp8(_mm256_xor_ps(_mm256_add_ps(y, y), sign));
    }
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

// One head of q or k: optional RMSNorm into out, then rope on out[0, rope_dim) in place.
// Rope is written as the torch backend's tensors compute it: a*cos - b*sin, b*cos + a*sin.
inline void head_inputs(const float* x, const float* norm_w, const float* cs, const float* sn,
                        float* out, const AttentionInputsArgs& a) {
    if (norm_w != nullptr) {
        norm_row(x, norm_w, out, a.hd, a.eps, a.unit_offset);
    } else {
        std::memcpy(out, x, sizeof(float) * a.hd);
    }
    const int64_t half = a.rope_dim / 2;
    const int64_t stride = a.interleaved ? 2 : 1, partner = a.interleaved ? 1 : half;
    for (int64_t i = 0; i < half; ++i) {
        float* pa = out + i * stride;
        const float x0 = pa[0], x1 = pa[partner];
        const float r0 = x0 * cs[i] - x1 * sn[i];
        const float r1 = x1 * cs[i] + x0 * sn[i];
        pa[0] = r0;
        pa[partner] = r1;
    }
}

// dst[0 .. count) = src rounded to IEEE f16, to nearest even (the immediate rounding mode,
// whatever MXCSR says): the vector and the scalar conversion round alike, so a tail element
// gets the bits a vector lane would give it.
inline void store_half(uint16_t* dst, const float* src, int64_t count) {
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), h);
    }
    for (; j < count; ++j) dst[j] = _cvtss_sh(src[j], _MM_FROUND_TO_NEAREST_INT);
}

}  // namespace

void rms_norm_raw(const float* x, const float* w, float* out, int64_t rows, int64_t d, float eps,
                  bool unit_offset) {
    parallel_chunks(rows, grain_rows(d), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) norm_row(x + r * d, w, out + r * d, d, eps, unit_offset);
    });
}

void add_norm_raw(float* h, const float* delta, const float* w, const float* post_w, float* normed,
                  int64_t rows, int64_t d, float eps, bool unit_offset) {
    parallel_chunks(rows, grain_rows(d), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            float* hr = h + r * d;
            const float* dr = delta + r * d;
            if (post_w != nullptr) {  // h + (delta / rms(delta)) * post_gain
                const __m256 s = _mm256_set1_ps(rms_of(dr, d, eps));
                for (int64_t j = 0; j < d; j += 8) {
                    const __m256 t = _mm256_mul_ps(_mm256_div_ps(load8(dr + j, d - j), s),
                                                   gain8(post_w + j, d - j, unit_offset));
                    store8(hr + j, _mm256_add_ps(load8(hr + j, d - j), t), d - j);
                }
            } else {
                for (int64_t j = 0; j < d; j += 8) {
                    store8(hr + j, _mm256_add_ps(load8(hr + j, d - j), load8(dr + j, d - j)), d - j);
                }
            }
            norm_row(hr, w, normed + r * d, d, eps, unit_offset);
        }
    });
}

void glu_raw(const float* x, float* out, int64_t rows, int64_t f, int kind) {
    parallel_chunks(rows, grain_rows(2 * f), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            const float* gate = x + r * 2 * f;
            const float* up = gate + f;
            float* o = out + r * f;
            for (int64_t j = 0; j < f; j += 8) {
                store8(o + j, glu8(load8(gate + j, f - j), load8(up + j, f - j), kind), f - j);
            }
        }
    });
}

void clamped_swiglu_raw(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
    const __m256 one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
    const __m256 neg_alpha = _mm256_set1_ps(-alpha);
    // Every op is lane-wise, so an element's bits do not depend on the lanes it rides in.
    parallel_chunks((n + 7) / 8, grain_rows(16), [&](int64_t b, int64_t e) {
        for (int64_t j = 8 * b; j < std::min(n, 8 * e); j += 8) {
            const __m256 g = _mm256_min_ps(load8(gate + j, n - j), hi);
            const __m256 u = _mm256_min_ps(_mm256_max_ps(load8(up + j, n - j), lo), hi);
            const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_mul_ps(neg_alpha, g))));
            store8(out + j, _mm256_mul_ps(_mm256_add_ps(u, one), s), n - j);
        }
    });
}

void attention_inputs_raw(const AttentionInputsArgs& a) {
    const int64_t width = (a.h + 2 * a.kvh) * a.hd, kv_width = a.kvh * a.hd, half = a.rope_dim / 2;
    const bool f16 = a.k_half != nullptr;
    parallel_chunks(a.n, grain_rows(width), [&](int64_t b, int64_t e) {
        std::vector<float> k_row(f16 ? kv_width : 0);  // an f16 cache's K row before rounding
        for (int64_t r = b; r < e; ++r) {
            // qkv row:  | q: h heads | k: kvh heads | v: kvh heads |   (each head hd floats)
            const float* row = a.qkv + r * width;
            const float* cs = a.cos + a.positions[r] * half;
            const float* sn = a.sin + a.positions[r] * half;
            float* k_dst = f16 ? k_row.data() : a.k_cache + a.slots[r] * kv_width;
            for (int64_t i = 0; i < a.h; ++i) {
                head_inputs(row + i * a.hd, a.q_norm, cs, sn, a.q_out + (r * a.h + i) * a.hd, a);
            }
            for (int64_t i = 0; i < a.kvh; ++i) {
                head_inputs(row + (a.h + i) * a.hd, a.k_norm, cs, sn, k_dst + i * a.hd, a);
            }
            const float* v_src = row + (a.h + a.kvh) * a.hd;
            if (f16) {
                store_half(a.k_half + a.slots[r] * kv_width, k_dst, kv_width);
                store_half(a.v_half + a.slots[r] * kv_width, v_src, kv_width);
            } else {
                std::memcpy(a.v_cache + a.slots[r] * kv_width, v_src, sizeof(float) * kv_width);
            }
        }
    });
}

}  // namespace agentkv
