// Several independent matmuls as one call from Python, with the bits of separate calls.
//
// head_matmuls: out[i] = xs[i] @ ws[i].T for f32 weights of one shape (MLA's per-head W_UK and
// W_UV, hal/mla.py). On the AVX-512 build, for the rows qmatmul_raw decodes (m <= 48), every
// problem's columns are one parallel loop (decode_all), each column computed by
// avx512::decode_range exactly as qmatmul_raw computes it: threads split columns only, so the
// bits are those of one matmul_f32 call per head, without a Python crossing and a pool
// dispatch per head. Otherwise each problem is its own qmatmul_raw call, as before.
#include "grouped.h"

#include <algorithm>
#include <vector>

#include "ops.h"
#include "pool.h"
#include "qmatmul.h"
#include "qmatmul_vnni.h"

namespace agentkv {

namespace {
// A decode matmul's columns are worth a pool chunk from this many weight bytes (as qmatmul.cpp).
constexpr int64_t MIN_TASK_BYTES = 16 * 1024;
}  // namespace

// Chunks are multiples of 4 columns of the jobs' joined column space (a job's own columns
// stay in 4s unless its n is not a multiple of 4; the grouping never changes a bit).
// int8: each job whose qtype has an int8 kernel has its rows rounded once, before the loop, as
// qmatmul_raw's run_int8 rounds them (a job reading an earlier job's rows with the same
// rounding, int8::rounding_of, as an expert's up after its gate, reuses it); its columns then
// take int8::columns. A job with no rounding (q null) takes avx512::decode_range.
void decode_all(const std::vector<Problem>& jobs, const std::vector<int>& qtypes, bool int8) {
    std::vector<RowBuffers> buffers(int8 ? jobs.size() : 0);
    std::vector<QuantRows> rounded(jobs.size());
    for (size_t j = 0; j < buffers.size(); ++j) {
        if (!int8::qtype_supported(qtypes[j])) continue;
        const Problem& p = jobs[j];
        const int rounding = int8::rounding_of(qtypes[j]);
        for (size_t i = 0; i < j && rounded[j].q == nullptr; ++i)
            if (rounded[i].q != nullptr && jobs[i].x == p.x && jobs[i].m == p.m && jobs[i].k == p.k &&
                int8::rounding_of(qtypes[i]) == rounding)
                rounded[j] = rounded[i];
        if (rounded[j].q != nullptr) continue;
        rounded[j] = buffers[j].size_for(p.m, p.k);
        int8::quantize_rows(p.x, 0, p.m, p.k, rounding, rounded[j]);
    }
    // job j's columns are [start[j], start[j + 1]) of one index space
    std::vector<int64_t> start(jobs.size() + 1, 0);
    int64_t bytes = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        start[j + 1] = start[j] + jobs[j].n;
        bytes += jobs[j].n * jobs[j].row_bytes;
    }
    const int64_t total = start.back();
    if (total == 0) return;
    const int64_t grain = std::max<int64_t>(4, MIN_TASK_BYTES * total / std::max<int64_t>(1, bytes));
    parallel_chunks(
        total, grain,
        [&](int64_t b, int64_t e) {
            size_t j = 0;
            while (b < e) {
                while (start[j + 1] <= b) ++j;
                const int64_t c0 = b - start[j], c1 = std::min(jobs[j].n, c0 + (e - b));
                if (rounded[j].q == nullptr)
                    avx512::decode_range(jobs[j], qtypes[j], c0, c1);
                else
                    int8::columns(jobs[j], rounded[j], qtypes[j], c0, c1);
                b += c1 - c0;
            }
        },
        4, 4);
}

namespace ops {
namespace {

void check_2d_f32(const at::Tensor& t, const char* name, size_t i) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous(),
                "head_matmuls: ", name, "[", i, "] must be a contiguous 2-D CPU float32 tensor, got ", t.scalar_type(),
                " ", t.sizes());
}

std::vector<at::Tensor> head_matmuls(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ws) {
    const int isa = fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    TORCH_CHECK(!xs.empty() && xs.size() == ws.size(), "head_matmuls: ", xs.size(), " inputs for ", ws.size(),
                " weights");
    check_2d_f32(xs[0], "xs", 0);
    check_2d_f32(ws[0], "ws", 0);
    const int64_t m = xs[0].size(0), n = ws[0].size(0), k = ws[0].size(1);
    TORCH_CHECK(k % 32 == 0, "head_matmuls: k=", k, " must be a multiple of 32");
    for (size_t i = 0; i < xs.size(); ++i) {
        check_2d_f32(xs[i], "xs", i);
        check_2d_f32(ws[i], "ws", i);
        TORCH_CHECK(xs[i].size(0) == m && xs[i].size(1) == k && ws[i].size(0) == n && ws[i].size(1) == k,
                    "head_matmuls: xs[", i, "] ", xs[i].sizes(), " and ws[", i, "] ", ws[i].sizes(),
                    " must be [m=", m, ", k=", k, "] and [n=", n, ", k]");
    }
    std::vector<at::Tensor> outs;
    std::vector<Problem> jobs;
    for (size_t i = 0; i < xs.size(); ++i) {
        outs.push_back(at::empty({m, n}, xs[i].options()));
        jobs.push_back({xs[i].data_ptr<float>(), reinterpret_cast<const uint8_t*>(ws[i].data_ptr<float>()),
                        outs.back().data_ptr<float>(), m, n, k, k * 4});
    }
    if (m == 0 || n == 0) return outs;
    if (isa == ISA_AVX512 && m <= avx512::DECODE_MAX_ROWS) {
        decode_all(jobs, std::vector<int>(jobs.size(), 0));
        return outs;
    }
    for (const Problem& p : jobs) qmatmul_raw(p.x, p.w, p.out, p.m, p.n, p.k, p.row_bytes, 0);
    return outs;
}

// [x [m, k] @ ws[i].T] for weights of any qtype (GGUF rows, or f32 rows with qtype 0) that
// read one input: one parallel loop over all their columns where decode_all applies, else one
// qmatmul_raw each; either way each output has the bits of its own qmatmul call.
std::vector<at::Tensor> qmatmuls(const at::Tensor& x, const std::vector<at::Tensor>& ws, const std::vector<int64_t>& qtypes,
                                 const std::vector<int64_t>& ns, bool int8) {
    const int isa = fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_2d_f32(x, "x", 0);
    TORCH_CHECK(!ws.empty() && ws.size() == qtypes.size() && ws.size() == ns.size(), "qmatmuls: ", ws.size(),
                " weights, ", qtypes.size(), " qtypes, ", ns.size(), " row counts");
    const int64_t m = x.size(0), k = x.size(1);
    std::vector<at::Tensor> outs;
    std::vector<Problem> jobs;
    std::vector<int> types;
    for (size_t i = 0; i < ws.size(); ++i) {
        const at::Tensor& w = ws[i];
        TORCH_CHECK(w.device().is_cpu() && w.is_contiguous() && ns[i] > 0 && w.nbytes() % ns[i] == 0,
                    "qmatmuls: ws[", i, "] must be a contiguous CPU tensor of ", ns[i], " rows");
        const int64_t row_bytes = static_cast<int64_t>(w.nbytes()) / ns[i];
        int qk = 0, bytes = 0;
        TORCH_CHECK(qtype_info(static_cast<int>(qtypes[i]), qk, bytes), "qmatmuls: unsupported qtype ", qtypes[i],
                    " (ws[", i, "])");
        TORCH_CHECK(k % qk == 0 && k / qk * bytes == row_bytes, "qmatmuls: ws[", i, "] rows of ", row_bytes,
                    " bytes do not hold k=", k, " weights of qtype ", qtypes[i]);
        outs.push_back(at::empty({m, ns[i]}, x.options()));
        jobs.push_back({x.data_ptr<float>(), static_cast<const uint8_t*>(w.data_ptr()), outs.back().data_ptr<float>(),
                        m, ns[i], k, row_bytes});
        types.push_back(static_cast<int>(qtypes[i]));
    }
    if (m == 0) return outs;
    if (isa == ISA_AVX512 && m <= avx512::DECODE_MAX_ROWS) {
        decode_all(jobs, types, int8);
        return outs;
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        const Problem& p = jobs[i];
        qmatmul_raw(p.x, p.w, p.out, p.m, p.n, p.k, p.row_bytes, types[i], int8);
    }
    return outs;
}

}  // namespace

void bind_grouped(pybind11::module_& m) {
    m.def("qmatmuls", &qmatmuls, pybind11::call_guard<pybind11::gil_scoped_release>(),
          "[x [m, k] @ ws[i] [ns[i], k].T] for weights of one input, any qtypes (0: f32 rows): the bits of one "
          "qmatmul call each",
          pybind11::arg("x"), pybind11::arg("ws"), pybind11::arg("qtypes"), pybind11::arg("ns"),
          pybind11::arg("int8") = false);
    m.def("head_matmuls", &head_matmuls, pybind11::call_guard<pybind11::gil_scoped_release>(),
          "[xs[i] [m, k] @ ws[i] [n, k].T] for f32 weights of one shape, k a multiple of 32: the bits of one "
          "matmul_f32 call each",
          pybind11::arg("xs"), pybind11::arg("ws"));
}

}  // namespace ops
}  // namespace agentkv
