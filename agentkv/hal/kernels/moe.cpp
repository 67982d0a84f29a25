// The routed experts of one MoE layer as one call from Python (the `cpu` backend's moe_ffn).
//
// Routing (router matmul, softmax, top-k, renormalisation) stays in Python; this runs the
// rest of hal/portable/moe.py's grouped_moe with the same kernels in the same order, so the
// bits are that path's:
//
//   slots s = token * k + rank, grouped by expert (stable: ascending slot within an expert)
//   for each expert e that some slot chose, in expert order:
//       rows = x[slot / k]   --gate--> g [c, f]   --up--> u [c, f]   (qmatmul_raw / matmul_f32)
//       h = glu(g | u)       --down--> y [c, d]   -> slots_out[slot]
//   out[t] = p[t, 0] * y[t, 0];  out[t] = out[t] + p[t, j] * y[t, j] for j = 1 .. k-1
//
// gpt-oss's biased experts (hal/biased_moe.py) take the same route with each projection's
// per-expert bias added to its output rows (g += bg[e], u += bu[e], y += bd[e]) and the
// clamped SwiGLU of fused.cpp in place of glu (act 2); elementwise, so still row-invariant.
//
// Every matmul is the row-invariant driver of qmatmul.cpp (threads over output columns), the
// activation is fused.cpp's glu, and the weighted sum is elementwise in rank order, so a
// token's bits depend only on its own row, never on which tokens share its batch or chunk.
// With the backend's int8 activations every expert matmul takes qmatmul_raw's int8 path (each
// row rounded on its own), as the composed path's backend.matmul does.
// The experts stay in the file's quant blocks: each is a view into the 3-D GGUF tensor.
//
// Decode (every active expert has <= 4 rows, quantized experts, the AVX-512 build): the gate
// and up matmuls of all active experts are one parallel loop over all their output columns,
// and so are the down matmuls, each column computed by avx512::decode_range exactly as
// qmatmul_raw computes it for that problem (threads split columns only, so the same bits),
// instead of three pool dispatches per expert.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fused.h"
#include "grouped.h"
#include "ops.h"
#include "pool.h"
#include "qmatmul.h"
#include "qmatmul_impl.h"

namespace agentkv {
namespace ops {
namespace {

// One projection of every expert: expert e's `[rows, k]` weight, in `qtype` (0: f32 rows).
struct ExpertBank {
    std::vector<at::Tensor> w;
    int64_t qtype = 0, rows = 0, k = 0, row_bytes = 0;
    std::vector<const uint8_t*> blocks;  // w[e]'s bytes (quantized banks)
    std::vector<at::Tensor> bias;         // bias[e] f32 [rows], or empty: no bias

    // out[r] += bias[e] for each of the c rows of out [c, rows]
    void add_bias(int64_t e, float* out, int64_t c) const {
        if (bias.empty()) return;
        const float* b = bias[e].data_ptr<float>();
        for (int64_t r = 0; r < c; ++r)
            for (int64_t i = 0; i < rows; ++i) out[r * rows + i] = out[r * rows + i] + b[i];
    }

    // out[c, rows] = x[c, k] @ w[e].T (int8: qmatmul_raw's int8-activation path)
    void apply(int64_t e, const float* x, int64_t c, float* out, bool int8) const {
        if (qtype == 0) {
            const at::Tensor xs = at::from_blob(const_cast<float*>(x), {c, k}, at::TensorOptions().dtype(at::kFloat));
            const at::Tensor y = ops::matmul_f32(xs, w[e]);
            std::memcpy(out, y.data_ptr<float>(), sizeof(float) * c * rows);
            return;
        }
        qmatmul_raw(x, w[e].data_ptr<uint8_t>(), out, c, rows, k, row_bytes, static_cast<int>(qtype), int8);
    }
};

int64_t bank_row_bytes(int64_t qtype, int64_t k) {
    if (qtype == 0) return k * 4;
    int qk = 0, bytes = 0;
    TORCH_CHECK(qtype_info(static_cast<int>(qtype), qk, bytes), "expert qtype ", qtype, " is not supported");
    TORCH_CHECK(k % qk == 0, "expert k=", k, " must be a multiple of ", qk, " for qtype ", qtype);
    return k / qk * bytes;
}

ExpertBank bank(std::vector<at::Tensor> w, std::vector<at::Tensor> bias, int64_t qtype, int64_t rows, int64_t k,
                const char* name) {
    TORCH_CHECK(!w.empty(), name, ": no experts");
    const int64_t rb = bank_row_bytes(qtype, k);
    for (size_t e = 0; e < w.size(); ++e) {
        const at::Tensor& t = w[e];
        TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, "[", e, "] must be a contiguous CPU tensor");
        if (qtype == 0) {
            TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.size(0) == rows && t.size(1) == k, name,
                        "[", e, "] must be float32 [", rows, ", ", k, "], got ", t.scalar_type(), " ", t.sizes());
        } else {
            TORCH_CHECK(t.scalar_type() == at::kByte && t.numel() == rows * rb, name, "[", e, "] must be ",
                        rows * rb, " uint8 bytes (", rows, " rows of ", rb, "), got ", t.scalar_type(), " ",
                        t.numel());
        }
    }
    TORCH_CHECK(bias.empty() || bias.size() == w.size(), name, ": ", bias.size(), " biases for ", w.size(),
                " experts");
    for (size_t e = 0; e < bias.size(); ++e)
        TORCH_CHECK(bias[e].device().is_cpu() && bias[e].is_contiguous() && bias[e].scalar_type() == at::kFloat &&
                        bias[e].numel() == rows,
                    name, " bias[", e, "] must be a contiguous float32 [", rows, "] tensor, got ",
                    bias[e].scalar_type(), " ", bias[e].sizes());
    std::vector<const uint8_t*> blocks;
    if (qtype != 0)
        for (const at::Tensor& t : w) blocks.push_back(t.data_ptr<uint8_t>());
    return ExpertBank{std::move(w), qtype, rows, k, rb, std::move(blocks), std::move(bias)};
}

// An expert some slot chose: its id, its first slot index in Groups::slots, its row count,
// and its first row in the work buffers (rows are in expert order, as the slots are).
struct Active {
    int64_t e, first, c, row0;
};

// Slots grouped by expert: slots[start[e] .. start[e + 1]) chose expert e, ascending.
struct Groups {
    std::vector<int64_t> start, slots;
};

Groups group_slots(const int64_t* chosen, int64_t slots, int64_t experts) {
    Groups g;
    g.start.assign(experts + 1, 0);
    for (int64_t s = 0; s < slots; ++s) {
        TORCH_CHECK(chosen[s] >= 0 && chosen[s] < experts, "chosen.flatten()[", s, "]=", chosen[s],
                    " out of range [0, ", experts, ")");
        ++g.start[chosen[s] + 1];
    }
    for (int64_t e = 0; e < experts; ++e) g.start[e + 1] += g.start[e];
    std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
    g.slots.resize(slots);
    for (int64_t s = 0; s < slots; ++s) g.slots[fill[chosen[s]]++] = s;
    return g;
}

constexpr int64_t CLAMPED_SWIGLU = 2;  // gpt-oss's activation (fused.h's clamped_swiglu_raw)

struct MoEExperts {
    ExpertBank gate, up, down;
    int64_t act = 0;
    float alpha = 0.0f, limit = 0.0f;  // CLAMPED_SWIGLU's gain and clamp
    bool int8 = false;                 // the backend's int8 activations (qmatmul.h)

    // h [c, f] from g and u [c, f] (each with its bias added), written over g; gu is scratch
    void activate(float* g, const float* u, float* gu, int64_t c) const {
        const int64_t f = gate.rows;
        if (act == CLAMPED_SWIGLU) {
            clamped_swiglu_raw(g, u, g, c * f, alpha, limit);
            return;
        }
        for (int64_t r = 0; r < c; ++r) {
            std::memcpy(gu + r * 2 * f, g + r * f, sizeof(float) * f);
            std::memcpy(gu + r * 2 * f + f, u + r * f, sizeof(float) * f);
        }
        glu_raw(gu, g, c, f, static_cast<int>(act));
    }

    int64_t experts() const { return static_cast<int64_t>(gate.w.size()); }

    // One expert over its `c` gathered rows `xr` [c, d]: writes y [c, d].
    void expert(int64_t e, const float* xr, int64_t c, std::vector<float>& buf, float* y) const {
        const int64_t f = gate.rows;
        buf.resize(static_cast<size_t>(c) * 4 * f);
        float* g = buf.data();
        float* u = g + c * f;
        float* gu = u + c * f;  // [c, 2f]: gate | up per row, as glu reads them
        gate.apply(e, xr, c, g, int8);
        up.apply(e, xr, c, u, int8);
        gate.add_bias(e, g, c);
        up.add_bias(e, u, c);
        activate(g, u, gu, c);  // h [c, f] over g's storage
        down.apply(e, g, c, y, int8);
        down.add_bias(e, y, c);
    }

    // x [n, d], chosen int64 [n, k], probs f32 [n, k] -> the weighted expert sum [n, d].
    at::Tensor run(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& probs) const {
        check_inputs(x, chosen, probs);
        const int64_t n = x.size(0), d = x.size(1), k = chosen.size(1);
        auto out = at::empty({n, d}, x.options());
        if (n == 0) return out;
        const Groups groups = group_slots(chosen.data_ptr<int64_t>(), n * k, experts());
        std::vector<Active> active;
        int64_t rows = 0, widest = 0;
        for (int64_t e = 0; e < experts(); ++e) {
            const int64_t c = groups.start[e + 1] - groups.start[e];
            if (c == 0) continue;
            active.push_back({e, groups.start[e], c, rows});
            rows += c;
            widest = std::max(widest, c);
        }
        // xr: each active expert's gathered rows, y: its outputs, both [rows, d] in expert order
        std::vector<float> xr(static_cast<size_t>(rows * d)), y(xr.size());
        const float* xs = x.data_ptr<float>();
        for (int64_t i = 0; i < rows; ++i)
            std::memcpy(xr.data() + i * d, xs + (groups.slots[i] / k) * d, sizeof(float) * d);
        if (widest <= 4 && decodes_together()) {
            decode_experts(active, xr.data(), y.data(), rows);
        } else {
            std::vector<float> buf;
            for (const Active& a : active) expert(a.e, xr.data() + a.row0 * d, a.c, buf, y.data() + a.row0 * d);
        }
        std::vector<float> slots_out(static_cast<size_t>(n * k * d));
        for (int64_t i = 0; i < rows; ++i)
            std::memcpy(slots_out.data() + groups.slots[i] * d, y.data() + i * d, sizeof(float) * d);
        weighted_sum(slots_out.data(), probs.data_ptr<float>(), out.data_ptr<float>(), n, k, d);
        return out;
    }

    bool decodes_together() const {
        return gate.qtype != 0 && up.qtype != 0 && down.qtype != 0 && fix_isa() == ISA_AVX512;
    }

    // Every active expert (<= 4 rows each) at once: gate|up as one parallel loop, glu, down as one.
    void decode_experts(const std::vector<Active>& active, const float* xr, float* y, int64_t rows) const {
        const int64_t f = gate.rows, d = gate.k;
        std::vector<float> g(static_cast<size_t>(rows * f)), u(g.size()), gu(2 * g.size());
        std::vector<Problem> jobs;
        std::vector<int> qtypes;
        for (const Active& a : active) {
            jobs.push_back({xr + a.row0 * d, gate.blocks[a.e], g.data() + a.row0 * f, a.c, f, d, gate.row_bytes});
            jobs.push_back({xr + a.row0 * d, up.blocks[a.e], u.data() + a.row0 * f, a.c, f, d, up.row_bytes});
            qtypes.push_back(static_cast<int>(gate.qtype));
            qtypes.push_back(static_cast<int>(up.qtype));
        }
        decode_all(jobs, qtypes, int8);
        for (const Active& a : active) {
            gate.add_bias(a.e, g.data() + a.row0 * f, a.c);
            up.add_bias(a.e, u.data() + a.row0 * f, a.c);
        }
        activate(g.data(), u.data(), gu.data(), rows);  // h [rows, f] over g
        jobs.clear();
        qtypes.clear();
        for (const Active& a : active) {
            jobs.push_back({g.data() + a.row0 * f, down.blocks[a.e], y + a.row0 * d, a.c, d, f, down.row_bytes});
            qtypes.push_back(static_cast<int>(down.qtype));
        }
        decode_all(jobs, qtypes, int8);
        for (const Active& a : active) down.add_bias(a.e, y + a.row0 * d, a.c);
    }

    static void weighted_sum(const float* ys, const float* p, float* out, int64_t n, int64_t k, int64_t d) {
        for (int64_t t = 0; t < n; ++t) {
            float* o = out + t * d;
            const float* yt = ys + t * k * d;
            for (int64_t i = 0; i < d; ++i) o[i] = p[t * k] * yt[i];
            for (int64_t j = 1; j < k; ++j) {
                const float pj = p[t * k + j];
                const float* yj = yt + j * d;
                for (int64_t i = 0; i < d; ++i) o[i] = o[i] + pj * yj[i];
            }
        }
    }

    void check_inputs(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& probs) const {
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
                    "x must be a contiguous CPU float32 [n, d] tensor, got ", x.scalar_type(), " ", x.sizes());
        TORCH_CHECK(x.size(1) == gate.k, "x has ", x.size(1), " columns, the experts take d=", gate.k);
        TORCH_CHECK(chosen.scalar_type() == at::kLong && chosen.dim() == 2 && chosen.is_contiguous() &&
                        chosen.size(0) == x.size(0),
                    "chosen must be a contiguous int64 [n=", x.size(0), ", k] tensor, got ", chosen.scalar_type(),
                    " ", chosen.sizes());
        TORCH_CHECK(chosen.size(1) > 0, "chosen must have at least one expert per token, got ", chosen.sizes());
        TORCH_CHECK(probs.scalar_type() == at::kFloat && probs.is_contiguous() && probs.sizes() == chosen.sizes(),
                    "probs must be a contiguous float32 tensor of chosen's shape ", chosen.sizes(), ", got ",
                    probs.scalar_type(), " ", probs.sizes());
    }
};

MoEExperts moe_experts(std::vector<at::Tensor> gate, std::vector<at::Tensor> up, std::vector<at::Tensor> down,
                       std::vector<int64_t> qtypes, int64_t d, int64_t f, int64_t act,
                       std::vector<std::vector<at::Tensor>> biases, double alpha, double limit, bool int8) {
    TORCH_CHECK(qtypes.size() == 3, "qtypes must be [gate, up, down], got ", qtypes.size(), " entries");
    TORCH_CHECK(gate.size() == up.size() && gate.size() == down.size(), "experts: ", gate.size(), " gate, ",
                up.size(), " up and ", down.size(), " down weights");
    TORCH_CHECK(act == GLU_SILU || act == GLU_GELU_TANH || act == CLAMPED_SWIGLU, "act ", act,
                " unknown (0 silu, 1 gelu_tanh, 2 clamped swiglu)");
    TORCH_CHECK(act != CLAMPED_SWIGLU || limit > 0, "the clamped SwiGLU's limit must be > 0, got ", limit);
    TORCH_CHECK(biases.empty() || biases.size() == 3, "biases must be [] or [gate, up, down], got ", biases.size(),
                " lists");
    TORCH_CHECK(d > 0 && f > 0, "d=", d, " and f=", f, " must be > 0");
    biases.resize(3);
    return MoEExperts{bank(std::move(gate), std::move(biases[0]), qtypes[0], f, d, "gate"),
                      bank(std::move(up), std::move(biases[1]), qtypes[1], f, d, "up"),
                      bank(std::move(down), std::move(biases[2]), qtypes[2], d, f, "down"),
                      act,
                      static_cast<float>(alpha),
                      static_cast<float>(limit),
                      int8};
}

}  // namespace

void bind_moe(pybind11::module_& m) {
    namespace py = pybind11;
    py::class_<MoEExperts>(m, "MoEExperts")
        .def("run", &MoEExperts::run, py::call_guard<py::gil_scoped_release>(),
             "x [n, d], chosen int64 [n, k], probs f32 [n, k] -> sum_j probs[:, j] * expert_j(x) [n, d]",
             py::arg("x"), py::arg("chosen"), py::arg("probs"));
    m.def("moe_experts", &moe_experts,
          "one layer's routed experts: per-expert gate/up [f, d] and down [d, f] weights, qtypes [gate, up, down] "
          "(0 f32), d, f, act (0 silu, 1 gelu_tanh, 2 gpt-oss's clamped swiglu with alpha and limit), "
          "biases [] or per-expert f32 [gate, up, down] lists, int8 activations (qmatmul's int8 path)",
          py::arg("gate"), py::arg("up"), py::arg("down"), py::arg("qtypes"), py::arg("d"), py::arg("f"),
          py::arg("act"), py::arg("biases") = std::vector<std::vector<at::Tensor>>{}, py::arg("alpha") = 0.0,
          py::arg("limit") = 0.0, py::arg("int8") = false);
}

}  // namespace ops
}  // namespace agentkv
