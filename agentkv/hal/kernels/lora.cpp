// LoRA deltas for a batch whose rows use different adapters (or none), added in place:
//
//     y[i, col_p : col_p + out_p] += scale_p * (x[i] @ A_p^T) @ B_p^T    for every piece p
//                                                                       with slot_p == row_slot[i]
//
// A piece is one adapter's pair for one projection (a fused q+k+v or gate+up output takes one
// piece per part, at its column offset). Every row runs the same arithmetic in the same order
// whatever its neighbours are: the shrink sums 32 fixed lanes of k and then the lanes in one
// order, the expand sums over the rank in ascending order per output column, and threads split
// rows only. So a row's bits depend on that row's input and adapter alone (batch-invariant).
// A and B^T are f32 or f16 (read as uint8 rows; each value widened to f32 exactly).
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops.h"
#include "pool.h"

namespace agentkv {
namespace ops {
namespace {

constexpr int64_t LANES = 32;  // four independent 8-wide accumulators: no add waits on the last

// A and B^T are f32, or f16 (uint8 rows of twice the bytes, widened exactly by F16C).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return _cvtsh_ss(*p); }

// t[j] = x . a[j] over k: lane l sums the k = l (mod 32) products in ascending k, then the
// lanes reduce in one fixed tree (lane-wise across the four groups of 8, then 8 -> 1).
template <typename W>
void shrink(const float* x, const W* a, int64_t r, int64_t k, float* t) {
    const int64_t kl = k - k % LANES;
    for (int64_t j = 0; j < r; ++j) {
        const W* row = a + j * k;
        __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0, v3 = v0;
        for (int64_t c = 0; c < kl; c += LANES) {
            v0 = _mm256_add_ps(v0, _mm256_mul_ps(_mm256_loadu_ps(x + c), load8(row + c)));
            v1 = _mm256_add_ps(v1, _mm256_mul_ps(_mm256_loadu_ps(x + c + 8), load8(row + c + 8)));
            v2 = _mm256_add_ps(v2, _mm256_mul_ps(_mm256_loadu_ps(x + c + 16), load8(row + c + 16)));
            v3 = _mm256_add_ps(v3, _mm256_mul_ps(_mm256_loadu_ps(x + c + 24), load8(row + c + 24)));
        }
        alignas(32) float acc[LANES];
        _mm256_store_ps(acc, v0);
        _mm256_store_ps(acc + 8, v1);
        _mm256_store_ps(acc + 16, v2);
        _mm256_store_ps(acc + 24, v3);
        for (int64_t c = kl; c < k; ++c) acc[c - kl] += x[c] * load1(row + c);
        float v[8];
        for (int64_t l = 0; l < 8; ++l) v[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
        t[j] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
}

// y[o] += scale * sum_j t[j] * bt[j, o], the sum in ascending j per column o.
template <typename W>
void expand(const float* t, const W* bt, int64_t r, int64_t out, float scale, float* acc, float* y) {
    const int64_t o8 = out - out % 8;
    for (int64_t o = 0; o < out; ++o) acc[o] = 0.0f;
    for (int64_t j = 0; j < r; ++j) {
        const W* row = bt + j * out;
        const __m256 tj = _mm256_set1_ps(t[j]);
        for (int64_t o = 0; o < o8; o += 8)
            _mm256_storeu_ps(acc + o, _mm256_add_ps(_mm256_loadu_ps(acc + o), _mm256_mul_ps(tj, load8(row + o))));
        for (int64_t o = o8; o < out; ++o) acc[o] += t[j] * load1(row + o);
    }
    for (int64_t o = 0; o < out; ++o) y[o] += scale * acc[o];
}

// One piece for one row: the f32 or f16 instantiation by the weights' dtype.
void apply(const float* x, const at::Tensor& a, const at::Tensor& bt, int64_t k, float scale, float* t, float* acc,
           float* y) {
    const int64_t r = a.size(0);
    if (a.scalar_type() == at::kFloat) {
        shrink(x, a.data_ptr<float>(), r, k, t);
        expand(t, bt.data_ptr<float>(), r, bt.size(1), scale, acc, y);
    } else {
        shrink(x, reinterpret_cast<const uint16_t*>(a.data_ptr<uint8_t>()), r, k, t);
        expand(t, reinterpret_cast<const uint16_t*>(bt.data_ptr<uint8_t>()), r, bt.size(1) / 2, scale, acc, y);
    }
}

int64_t columns(const at::Tensor& w) { return w.scalar_type() == at::kFloat ? w.size(1) : w.size(1) / 2; }

void check_piece(const at::Tensor& x, const at::Tensor& y, const at::Tensor& a, const at::Tensor& bt, int64_t col,
                 size_t p) {
    for (const at::Tensor* w : {&a, &bt}) {
        TORCH_CHECK((w->scalar_type() == at::kFloat || (w->scalar_type() == at::kByte && w->size(1) % 2 == 0)) &&
                        w->dim() == 2 && w->is_contiguous() && w->device().is_cpu(),
                    "lora piece ", p, ": A and B^T must be contiguous CPU f32 or f16-byte 2-D tensors, got ",
                    w->scalar_type(), " ", w->sizes());
    }
    TORCH_CHECK(a.scalar_type() == bt.scalar_type(), "lora piece ", p, ": A is ", a.scalar_type(), ", B^T ",
                bt.scalar_type());
    TORCH_CHECK(columns(a) == x.size(1), "lora piece ", p, ": A has ", columns(a), " columns, x has ", x.size(1));
    TORCH_CHECK(a.size(0) == bt.size(0), "lora piece ", p, ": A has rank ", a.size(0), ", B^T has ", bt.size(0));
    TORCH_CHECK(col >= 0 && col + columns(bt) <= y.size(1), "lora piece ", p, ": columns [", col, ", ",
                col + columns(bt), ") exceed y's ", y.size(1));
}

void lora_add(const at::Tensor& x, at::Tensor y, const at::Tensor& row_slot, const std::vector<at::Tensor>& a,
              const std::vector<at::Tensor>& bt, const std::vector<int64_t>& slot, const std::vector<double>& scale,
              const std::vector<int64_t>& col) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be contiguous f32 [n, k]");
    TORCH_CHECK(y.scalar_type() == at::kFloat && y.dim() == 2 && y.is_contiguous() && y.size(0) == x.size(0),
                "y must be contiguous f32 [n, m] with x's ", x.size(0), " rows, got ", y.sizes());
    TORCH_CHECK(row_slot.scalar_type() == at::kInt && row_slot.dim() == 1 && row_slot.size(0) == x.size(0),
                "row_slot must be int32 [n=", x.size(0), "], got ", row_slot.scalar_type(), " ", row_slot.sizes());
    const size_t num = a.size();
    TORCH_CHECK(bt.size() == num && slot.size() == num && scale.size() == num && col.size() == num,
                "lora pieces: ", num, " A, ", bt.size(), " B^T, ", slot.size(), " slots, ", scale.size(),
                " scales, ", col.size(), " column offsets");
    int64_t max_r = 1, max_out = 1;
    for (size_t p = 0; p < num; ++p) {
        check_piece(x, y, a[p], bt[p], col[p], p);
        max_r = std::max(max_r, a[p].size(0));
        max_out = std::max(max_out, columns(bt[p]));
    }
    const int64_t n = x.size(0), k = x.size(1), m = y.size(1);
    const float* xs = x.data_ptr<float>();
    float* ys = y.data_ptr<float>();
    const int32_t* rs = row_slot.data_ptr<int32_t>();
    parallel_chunks(n, 4, [&](int64_t begin, int64_t end) {
        std::vector<float> t(max_r), acc(max_out);
        for (int64_t i = begin; i < end; ++i) {
            if (rs[i] < 0) continue;
            for (size_t p = 0; p < num; ++p) {
                if (slot[p] != rs[i]) continue;
                apply(xs + i * k, a[p], bt[p], k, static_cast<float>(scale[p]), t.data(), acc.data(),
                      ys + i * m + col[p]);
            }
        }
    });
}

}  // namespace

void bind_lora(pybind11::module_& m) {
    namespace py = pybind11;
    m.def("lora_add", &lora_add, py::call_guard<py::gil_scoped_release>(),
          "y[i, col:col+out] += scale * (x[i] @ A^T) @ B for each piece whose slot is row_slot[i] (in place)",
          py::arg("x"), py::arg("y"), py::arg("row_slot"), py::arg("a"), py::arg("bt"), py::arg("slot"),
          py::arg("scale"), py::arg("col"));
}

}  // namespace ops
}  // namespace agentkv
