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
#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "ops.h"
#include "pool.h"

namespace agentkv {
namespace ops {
namespace {

constexpr int64_t LANES = 32;  // four independent 8-wide accumulators: no add waits on the last

// t[j] = x . a[j] over k: lane l sums the k = l (mod 32) products in ascending k, then the
// lanes reduce in one fixed tree (lane-wise across the four groups of 8, then 8 -> 1).
void shrink(const float* x, const float* a, int64_t r, int64_t k, float* t) {
    const int64_t kl = k - k % LANES;
    for (int64_t j = 0; j < r; ++j) {
        const float* row = a + j * k;
        float acc[LANES] = {};
        for (int64_t c = 0; c < kl; c += LANES)
            for (int64_t l = 0; l < LANES; ++l) acc[l] += x[c + l] * row[c + l];
        for (int64_t c = kl; c < k; ++c) acc[c - kl] += x[c] * row[c];
        float v[8];
        for (int64_t l = 0; l < 8; ++l) v[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
        t[j] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
}

// y[o] += scale * sum_j t[j] * bt[j, o], the sum in ascending j per column o.
void expand(const float* t, const float* bt, int64_t r, int64_t out, float scale, float* acc, float* y) {
    for (int64_t o = 0; o < out; ++o) acc[o] = 0.0f;
    for (int64_t j = 0; j < r; ++j) {
        const float tj = t[j];
        const float* row = bt + j * out;
        for (int64_t o = 0; o < out; ++o) acc[o] += tj * row[o];
    }
    for (int64_t o = 0; o < out; ++o) y[o] += scale * acc[o];
}

void check_piece(const at::Tensor& x, const at::Tensor& y, const at::Tensor& a, const at::Tensor& bt, int64_t col,
                 size_t p) {
    TORCH_CHECK(a.scalar_type() == at::kFloat && a.dim() == 2 && a.is_contiguous() && a.device().is_cpu(),
                "lora piece ", p, ": A must be a contiguous CPU f32 [r, k] tensor, got ", a.scalar_type(), " ",
                a.sizes());
    TORCH_CHECK(bt.scalar_type() == at::kFloat && bt.dim() == 2 && bt.is_contiguous() && bt.device().is_cpu(),
                "lora piece ", p, ": B^T must be a contiguous CPU f32 [r, out] tensor, got ", bt.scalar_type(), " ",
                bt.sizes());
    TORCH_CHECK(a.size(1) == x.size(1), "lora piece ", p, ": A has ", a.size(1), " columns, x has ", x.size(1));
    TORCH_CHECK(a.size(0) == bt.size(0), "lora piece ", p, ": A has rank ", a.size(0), ", B^T has ", bt.size(0));
    TORCH_CHECK(col >= 0 && col + bt.size(1) <= y.size(1), "lora piece ", p, ": columns [", col, ", ",
                col + bt.size(1), ") exceed y's ", y.size(1));
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
        max_out = std::max(max_out, bt[p].size(1));
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
                const int64_t r = a[p].size(0), out = bt[p].size(1);
                shrink(xs + i * k, a[p].data_ptr<float>(), r, k, t.data());
                expand(t.data(), bt[p].data_ptr<float>(), r, out, static_cast<float>(scale[p]), acc.data(),
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
