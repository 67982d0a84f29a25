// DeepSeek sparse attention (DeepSeek-V3.2) over the latent KV rows (hal/mla_sparse.py's
// module docstring has the math). Stored row of key t: | latent (c, k_rope): L | k_index: D |.
// For query row r at position p, over its sequence's keys t = 0..p:
//
//     index[t] = sum_hi w[hi] * max((q_index[hi] . k_index[t]) * index_scale, 0)    hi in order
//     chosen   = the top_k t by falling index, the lower t first on equal scores (every key
//                while p < top_k), in position order
//     out[h]   = softmax((q_abs[h] . latent[t]) * scale, t in chosen) @ c[t]             t in order
//
// A dot product runs in 8 lanes (fma, x[0..] in order) reduced by simd.h's hsum8, then the
// tail; the softmax takes the max, then simd.h's exp8 of s - max and their sum in position order, then
// out = sum_t (e_t / sum) * c_t in position order. Rows are computed alone (threads split
// rows), so a row's bits depend on its own inputs and keys only: not on the batch, the split,
// the chunk or the thread count. One AVX2/FMA form serves both ISAs (the same bits on both).
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "ops.h"
#include "pool.h"
#include "qmatmul.h"
#include "simd.h"

namespace agentkv {
namespace ops {

void check_kv(const at::Tensor& k, const at::Tensor& v, int64_t dim);  // bindings.cpp
void check_paged_rows(const at::Tensor& block_tables, const at::Tensor& row_seq, const at::Tensor& row_pos, int64_t n);
float* f32_of(const at::Tensor& t);
uint16_t* half_of(const at::Tensor& t);
void check_attention_indices(const at::Tensor& block_tables, const at::Tensor& row_seq, const at::Tensor& row_pos,
                             int64_t num_blocks, int64_t block_size);

namespace {

struct Sparse {
    const float *q_abs, *q_index, *head_w;  // [n, h, L], [n, H, D], [n, H]
    const float* rows32;                    // the store [blocks, bs, 1, L + D] (f32), or
    const uint16_t* rows16;                 // its f16 bits
    const int32_t *tables, *row_seq, *row_pos;
    float* out;  // [n, h, kv_rank]
    int64_t h, L, kv_rank, H, D, bs, width, top_k;
    float scale, index_scale;

    // columns [from, from + len) of key t's stored row (sequence seq), widened to f32 (exact)
    void key(int64_t seq, int64_t t, int64_t from, int64_t len, float* dst) const {
        const int64_t slot = static_cast<int64_t>(tables[seq * width + t / bs]) * bs + t % bs;
        const int64_t at = slot * (L + D) + from;
        if (rows32 != nullptr) {
            std::memcpy(dst, rows32 + at, sizeof(float) * len);
            return;
        }
        const uint16_t* src = rows16 + at;
        int64_t j = 0;
        for (; j + 8 <= len; j += 8)
            _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
        for (; j < len; ++j) dst[j] = _cvtsh_ss(src[j]);
    }
};

inline float dot(const float* x, const float* y, int64_t len) {
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j), acc);
    float s = hsum8(acc);
    for (; j < len; ++j) s = std::fma(x[j], y[j], s);
    return s;
}

// y += a * x over len floats (one fma per element)
inline void axpy(float a, const float* x, float* y, int64_t len) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) _mm256_storeu_ps(y + j, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    for (; j < len; ++j) y[j] = std::fma(a, x[j], y[j]);
}

// Query row r's chosen key positions, ascending (the header's rule).
std::vector<int64_t> choose(const Sparse& a, int64_t r, int64_t seq, int64_t ctx) {
    std::vector<int64_t> order(ctx);
    std::iota(order.begin(), order.end(), int64_t{0});
    if (ctx <= a.top_k) return order;
    std::vector<float> index(ctx), k(a.D);
    const float* q = a.q_index + r * a.H * a.D;
    const float* w = a.head_w + r * a.H;
    for (int64_t t = 0; t < ctx; ++t) {
        a.key(seq, t, a.L, a.D, k.data());
        float s = 0.0f;
        for (int64_t hi = 0; hi < a.H; ++hi) s = std::fma(w[hi], std::max(dot(q + hi * a.D, k.data(), a.D) * a.index_scale, 0.0f), s);
        index[t] = s;
    }
    // a total order (score, then position), so the chosen set does not depend on the sort
    std::partial_sort(order.begin(), order.begin() + a.top_k, order.end(), [&](int64_t x, int64_t y) {
        return index[x] > index[y] || (index[x] == index[y] && x < y);
    });
    order.resize(a.top_k);
    std::sort(order.begin(), order.end());
    return order;
}

void attend_row(const Sparse& a, int64_t r) {
    const int64_t seq = a.row_seq[r], ctx = static_cast<int64_t>(a.row_pos[r]) + 1;
    const std::vector<int64_t> chosen = choose(a, r, seq, ctx);
    const int64_t k = static_cast<int64_t>(chosen.size());
    std::vector<float> keys(k * a.L), s((k + 7) / 8 * 8, 0.0f);  // exp8 over whole lanes
    for (int64_t j = 0; j < k; ++j) a.key(seq, chosen[j], 0, a.L, keys.data() + j * a.L);
    for (int64_t hh = 0; hh < a.h; ++hh) {
        const float* q = a.q_abs + (r * a.h + hh) * a.L;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < k; ++j) {
            s[j] = dot(q, keys.data() + j * a.L, a.L) * a.scale;
            m = std::max(m, s[j]);
        }
        for (int64_t j = 0; j < k; j += 8)
            _mm256_storeu_ps(s.data() + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s.data() + j), _mm256_set1_ps(m))));
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += s[j];
        float* o = a.out + (r * a.h + hh) * a.kv_rank;
        std::fill(o, o + a.kv_rank, 0.0f);
        for (int64_t j = 0; j < k; ++j) axpy(s[j] / sum, keys.data() + j * a.L, o, a.kv_rank);
    }
}

}  // namespace

at::Tensor sparse_latent_attention(const at::Tensor& q_abs, const at::Tensor& q_index, const at::Tensor& head_w,
                                   const at::Tensor& store, const at::Tensor& block_tables, const at::Tensor& row_seq,
                                   const at::Tensor& row_pos, int64_t kv_rank, int64_t top_k, double scale,
                                   double index_scale) {
    fix_isa();
    check_f32(q_abs, "q_abs", 3);
    check_f32(q_index, "q_index", 3);
    check_f32(head_w, "head_w", 2);
    check_kv(store, store, 4);
    const int64_t n = q_abs.size(0), L = q_abs.size(2), H = q_index.size(1), D = q_index.size(2);
    check_paged_rows(block_tables, row_seq, row_pos, n);
    TORCH_CHECK(q_index.size(0) == n && head_w.size(0) == n && head_w.size(1) == H, "q_index ", q_index.sizes(),
                " and head_w ", head_w.sizes(), " must have n=", n, " rows and H=", H, " index heads");
    TORCH_CHECK(store.size(2) == 1 && store.size(3) == L + D, "store row has ", store.size(3),
                " columns, expected latent ", L, " + index key ", D, " (one latent head)");
    TORCH_CHECK(kv_rank > 0 && kv_rank <= L, "kv_rank=", kv_rank, " must be in [1, ", L, "]");
    TORCH_CHECK(top_k > 0, "top_k must be > 0, got ", top_k);
    check_attention_indices(block_tables, row_seq, row_pos, store.size(0), store.size(1));
    auto out = at::empty({n, q_abs.size(1), kv_rank}, q_abs.options());
    if (n == 0 || q_abs.size(1) == 0) return out;
    const Sparse a{q_abs.data_ptr<float>(), q_index.data_ptr<float>(), head_w.data_ptr<float>(), f32_of(store),
                   half_of(store), block_tables.data_ptr<int32_t>(), row_seq.data_ptr<int32_t>(),
                   row_pos.data_ptr<int32_t>(), out.data_ptr<float>(), q_abs.size(1), L, kv_rank, H, D,
                   store.size(1), block_tables.size(1), top_k, static_cast<float>(scale),
                   static_cast<float>(index_scale)};
    parallel_chunks(n, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) attend_row(a, r);
    }, 1);
    return out;
}

void bind_sparse(pybind11::module_& m) {
    namespace py = pybind11;
    m.def("sparse_latent_attention", &sparse_latent_attention, py::call_guard<py::gil_scoped_release>(),
          "DeepSeek sparse attention over latent rows -> [n, h, kv_rank]", py::arg("q_abs"), py::arg("q_index"),
          py::arg("head_w"), py::arg("store"), py::arg("block_tables"), py::arg("row_seq"), py::arg("row_pos"),
          py::arg("kv_rank"), py::arg("top_k"), py::arg("scale"), py::arg("index_scale"));
}

}  // namespace ops
}  // namespace agentkv
