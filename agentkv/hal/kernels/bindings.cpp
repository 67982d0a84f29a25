// Python bindings: tensor checks at the boundary (dtype, shape, contiguity, index ranges),
// then the raw kernels. Every error quotes the bad value and the limit. The checked ops are
// also what layer.cpp composes (declared in ops.h).
#include <torch/extension.h>

#include <string>

#include "fused.h"
#include "ops.h"
#include "qmatmul.h"
#include "qmatmul_vnni.h"

namespace agentkv {
namespace ops {

void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims, got shape ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// A K or V cache: float32 or float16 (both of one cache the same), contiguous, on the CPU.
void check_kv(const at::Tensor& k, const at::Tensor& v, int64_t dim) {
    for (const at::Tensor* t : {&k, &v}) {
        const char* name = t == &k ? "k_cache" : "v_cache";
        TORCH_CHECK(t->device().is_cpu(), name, " must be a CPU tensor, got ", t->device());
        TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kHalf, name,
                    " must be float32 or float16, got ", t->scalar_type());
        TORCH_CHECK(t->dim() == dim, name, " must have ", dim, " dims, got shape ", t->sizes());
        TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    }
    TORCH_CHECK(k.scalar_type() == v.scalar_type(), "k_cache is ", k.scalar_type(), " but v_cache is ",
                v.scalar_type(), ": one cache holds one dtype");
    TORCH_CHECK(k.sizes() == v.sizes(), "k_cache ", k.sizes(), " and v_cache ", v.sizes(), " differ");
}

// The cache's f32 data, or null when it is f16 (then half_of gives its bits).
float* f32_of(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t.data_ptr<float>() : nullptr; }
uint16_t* half_of(const at::Tensor& t) {
    return t.scalar_type() == at::kHalf ? reinterpret_cast<uint16_t*>(t.data_ptr<at::Half>()) : nullptr;
}

void check_i32(const at::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kInt && t.dim() == dim && t.is_contiguous(),
                name, " must be a contiguous CPU int32 tensor with ", dim, " dims, got ",
                t.scalar_type(), " ", t.sizes());
}

int64_t row_bytes_of(int64_t qtype, int64_t k) {
    int qk = 0, bytes = 0;
    TORCH_CHECK(qtype_info(static_cast<int>(qtype), qk, bytes), "unsupported qtype ", qtype,
                " (supported: 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K,"
                " 30 BF16, 39 MXFP4, 1004 I4G32, 1008 I8G32, 1016 F8G32, 2002/2003/2006/2008/2039 those interleaved)");
    TORCH_CHECK(k > 0 && k % qk == 0, "k=", k, " must be a positive multiple of ", qk, " for qtype ", qtype);
    return k / qk * bytes;
}

void check_weight(const at::Tensor& w, int64_t qtype, int64_t n, int64_t k) {
    const int64_t rb = row_bytes_of(qtype, k);
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous(),
                "w must be a contiguous CPU uint8 tensor, got ", w.scalar_type());
    TORCH_CHECK(w.numel() == n * rb, "w has ", w.numel(), " bytes, expected n*row_bytes = ", n, "*", rb);
}

at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t n, int64_t k, bool int8) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(x, "x", 2);
    TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns, expected k=", k);
    check_weight(w, qtype, n, k);
    auto out = at::empty({x.size(0), n}, x.options());
    if (x.size(0) == 0 || n == 0) return out;
    qmatmul_raw(x.data_ptr<float>(), w.data_ptr<uint8_t>(), out.data_ptr<float>(), x.size(0), n, k,
                row_bytes_of(qtype, k), static_cast<int>(qtype), int8);
    return out;
}

// f32 weights ride the quant driver as 32-float blocks; a k that is not a multiple of 32 is
// zero-padded (both sides), which adds exact zeros in the same place for every row.
at::Tensor matmul_f32(const at::Tensor& x, const at::Tensor& w) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(x, "x", 2);
    check_f32(w, "w", 2);
    const int64_t k = x.size(1), n = w.size(0);
    TORCH_CHECK(w.size(1) == k, "w has ", w.size(1), " columns, expected k=", k, " (x.size(1))");
    auto out = at::empty({x.size(0), n}, x.options());
    if (x.size(0) == 0 || n == 0 || k == 0) return out.zero_();
    const int64_t kp = (k + 31) / 32 * 32;
    at::Tensor xp = x, wp = w;
    if (kp != k) {
        xp = at::constant_pad_nd(x, {0, kp - k});
        wp = at::constant_pad_nd(w, {0, kp - k});
    }
    qmatmul_raw(xp.data_ptr<float>(), reinterpret_cast<const uint8_t*>(wp.data_ptr<float>()),
                out.data_ptr<float>(), x.size(0), n, kp, kp * 4, 0);
    return out;
}

// A file's Q4_0, Q4_1, Q5_0, Q8_0 or MXFP4 rows [n, row_bytes] -> a new tensor of the same rows interleaved
// for the int8 kernels (the qtype + 2000: qmatmul_vnni.h).
at::Tensor interleave_rows(const at::Tensor& w, int64_t qtype, int64_t n, int64_t k) {
    check_weight(w, qtype, n, k);
    TORCH_CHECK(agentkv::interleaved_source(static_cast<int>(qtype) + agentkv::INTERLEAVED_OFFSET), "interleave_rows: qtype ",
                qtype, " has no interleaved form (2 Q4_0, 3 Q4_1, 6 Q5_0, 8 Q8_0, 39 MXFP4 do)");
    auto out = at::empty_like(w);
    agentkv::interleave_rows(w.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), n, k, static_cast<int>(qtype));
    return out;
}

at::Tensor dequantize(const at::Tensor& w, int64_t qtype, int64_t n, int64_t k) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_weight(w, qtype, n, k);
    auto out = at::empty({n, k}, at::TensorOptions().dtype(at::kFloat));
    dequantize_raw(w.data_ptr<uint8_t>(), out.data_ptr<float>(), n, k, row_bytes_of(qtype, k),
                   static_cast<int>(qtype));
    return out;
}

void check_attention_indices(const at::Tensor& block_tables, const at::Tensor& row_seq,
                             const at::Tensor& row_pos, int64_t num_blocks, int64_t block_size) {
    const int64_t num_seqs = block_tables.size(0), mbps = block_tables.size(1);
    const int32_t* bt = block_tables.data_ptr<int32_t>();
    const int32_t* rs = row_seq.data_ptr<int32_t>();
    const int32_t* rp = row_pos.data_ptr<int32_t>();
    for (int64_t i = 0; i < row_seq.size(0); ++i) {
        TORCH_CHECK(rs[i] >= 0 && rs[i] < num_seqs, "row_seq[", i, "]=", rs[i], " out of range [0, ", num_seqs, ")");
        TORCH_CHECK(rp[i] >= 0 && rp[i] < mbps * block_size, "row_pos[", i, "]=", rp[i],
                    " out of range [0, max_blocks_per_seq*block_size=", mbps * block_size, ")");
        for (int64_t b = 0; b <= rp[i] / block_size; ++b) {
            const int32_t id = bt[rs[i] * mbps + b];
            TORCH_CHECK(id >= 0 && id < num_blocks, "block_tables[", rs[i], "][", b, "]=", id,
                        " out of range [0, ", num_blocks, ")");
        }
    }
}

// A paged op's row indices: int32 block tables [num_seqs, width], row -> sequence and row ->
// position for each of the n rows (their ranges: check_attention_indices).
void check_paged_rows(const at::Tensor& block_tables, const at::Tensor& row_seq, const at::Tensor& row_pos, int64_t n) {
    check_i32(block_tables, "block_tables", 2);
    check_i32(row_seq, "row_seq", 1);
    check_i32(row_pos, "row_pos", 1);
    TORCH_CHECK(row_seq.size(0) == n && row_pos.size(0) == n, "row_seq/row_pos must have n=", n, " entries");
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& row_seq,
                           const at::Tensor& row_pos, double scale, int64_t window, double softcap,
                           const c10::optional<at::Tensor>& sinks) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(q, "q", 3);
    check_kv(k_cache, v_cache, 4);
    const int64_t n = q.size(0), h = q.size(1), hd = q.size(2), kvh = k_cache.size(2);
    check_paged_rows(block_tables, row_seq, row_pos, n);
    TORCH_CHECK(k_cache.size(3) == hd, "k_cache head_dim ", k_cache.size(3), " != q head_dim ", hd);
    TORCH_CHECK(kvh > 0 && h % kvh == 0, "num heads ", h, " is not a multiple of kv heads ", kvh);
    TORCH_CHECK(window >= 0, "window must be >= 0, got ", window);
    TORCH_CHECK(softcap >= 0, "softcap must be >= 0, got ", softcap);
    check_indices_once(0, {block_tables, row_seq, row_pos}, {k_cache.size(0), k_cache.size(1)},
                       [&] { check_attention_indices(block_tables, row_seq, row_pos, k_cache.size(0), k_cache.size(1)); });
    if (sinks.has_value()) {
        check_f32(*sinks, "sinks", 1);
        TORCH_CHECK(sinks->size(0) == h, "sinks has ", sinks->size(0), " entries, expected one per head: ", h);
    }
    auto out = at::empty_like(q);
    if (n == 0 || h == 0 || hd == 0) return out;
    AttentionArgs a{q.data_ptr<float>(), f32_of(k_cache), f32_of(v_cache),
                    block_tables.data_ptr<int32_t>(), row_seq.data_ptr<int32_t>(),
                    row_pos.data_ptr<int32_t>(), out.data_ptr<float>(), n, h, kvh, hd,
                    k_cache.size(1), block_tables.size(1), static_cast<float>(scale),
                    static_cast<float>(softcap), window, half_of(k_cache), half_of(v_cache),
                    sinks.has_value() ? sinks->data_ptr<float>() : nullptr};
    paged_attention_raw(a);
    return out;
}

// -- fused glue ops (fused.cpp) -----------------------------------------------------------

void check_gain(const c10::optional<at::Tensor>& w, const char* name, int64_t d) {
    if (!w.has_value()) return;
    check_f32(*w, name, 1);
    TORCH_CHECK(w->size(0) == d, name, " has ", w->size(0), " entries, expected d=", d);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool unit_offset) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    TORCH_CHECK(x.dim() >= 1, "x must have at least 1 dim, got shape ", x.sizes());
    check_f32(x, "x", x.dim());
    const int64_t d = x.size(-1);
    check_gain(w, "weight", d);
    auto out = at::empty_like(x);
    if (x.numel() == 0) return out;
    rms_norm_raw(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), x.numel() / d, d,
                 static_cast<float>(eps), unit_offset);
    return out;
}

at::Tensor add_norm(at::Tensor h, const at::Tensor& delta, const at::Tensor& w,
                    const c10::optional<at::Tensor>& post_w, double eps, bool unit_offset) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(h, "h", 2);
    check_f32(delta, "delta", 2);
    TORCH_CHECK(delta.sizes() == h.sizes(), "delta has shape ", delta.sizes(), ", expected h's ", h.sizes());
    const int64_t d = h.size(1);
    check_gain(w, "weight", d);
    check_gain(post_w, "post_weight", d);
    auto normed = at::empty_like(h);
    if (h.numel() == 0) return normed;
    add_norm_raw(h.data_ptr<float>(), delta.data_ptr<float>(), w.data_ptr<float>(),
                 post_w.has_value() ? post_w->data_ptr<float>() : nullptr, normed.data_ptr<float>(),
                 h.size(0), d, static_cast<float>(eps), unit_offset);
    return normed;
}

at::Tensor glu(const at::Tensor& x, int64_t kind) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(x, "x", 2);
    TORCH_CHECK(x.size(1) % 2 == 0, "x has ", x.size(1), " columns; gate|up needs an even count");
    TORCH_CHECK(kind == GLU_SILU || kind == GLU_GELU_TANH, "glu kind ", kind, " unknown (0 silu, 1 gelu_tanh)");
    const int64_t f = x.size(1) / 2;
    auto out = at::empty({x.size(0), f}, x.options());
    if (out.numel() == 0) return out;
    glu_raw(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), f, static_cast<int>(kind));
    return out;
}

at::Tensor clamped_swiglu(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit) {
    fix_isa();
    check_f32(gate, "gate", 1);
    check_f32(up, "up", 1);
    TORCH_CHECK(gate.numel() == up.numel(), "gate has ", gate.numel(), " elements, up ", up.numel());
    auto out = at::empty_like(gate);
    if (out.numel() == 0) return out;
    clamped_swiglu_raw(gate.data_ptr<float>(), up.data_ptr<float>(), out.data_ptr<float>(), gate.numel(),
                       static_cast<float>(alpha), static_cast<float>(limit));
    return out;
}

void check_i64_range(const at::Tensor& t, const char* name, int64_t n, int64_t limit, const char* limit_name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
                name, " must be a contiguous CPU int64 tensor with 1 dim, got ", t.scalar_type(), " ", t.sizes());
    TORCH_CHECK(t.size(0) == n, name, " has ", t.size(0), " entries, expected n=", n);
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
        TORCH_CHECK(p[i] >= 0 && p[i] < limit, name, "[", i, "]=", p[i], " out of range [0, ", limit_name, "=", limit, ")");
    }
}

at::Tensor attention_inputs(const at::Tensor& qkv, const c10::optional<at::Tensor>& q_norm,
                            const c10::optional<at::Tensor>& k_norm, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& slots,
                            at::Tensor k_cache, at::Tensor v_cache, int64_t h, int64_t kvh,
                            int64_t rope_dim, bool interleaved, double eps, bool unit_offset) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(qkv, "qkv", 2);
    check_kv(k_cache, v_cache, 3);
    check_f32(cos, "cos", 2);
    check_f32(sin, "sin", 2);
    const int64_t n = qkv.size(0), hd = k_cache.size(2);
    TORCH_CHECK(h > 0 && kvh > 0, "num_heads=", h, " and num_kv_heads=", kvh, " must be > 0");
    TORCH_CHECK(k_cache.size(1) == kvh, "k_cache has ", k_cache.size(1), " kv heads, expected num_kv_heads=", kvh);
    TORCH_CHECK(qkv.size(1) == (h + 2 * kvh) * hd, "qkv has ", qkv.size(1), " columns, expected (h + 2*kvh)*hd = (",
                h, " + 2*", kvh, ")*", hd, " = ", (h + 2 * kvh) * hd);
    TORCH_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= hd, "rope_dim=", rope_dim,
                " must be even and in (0, head_dim=", hd, "]");
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(1) == rope_dim / 2, "cos/sin tables have shapes ",
                cos.sizes(), " and ", sin.sizes(), ", expected [num_pos, rope_dim/2=", rope_dim / 2, "]");
    check_gain(q_norm, "q_norm", hd);
    check_gain(k_norm, "k_norm", hd);
    check_indices_once(1, {positions, slots}, {n, cos.size(0), k_cache.size(0)}, [&] {
        check_i64_range(positions, "positions", n, cos.size(0), "num_pos");
        check_i64_range(slots, "slots", n, k_cache.size(0), "num_slots");
    });
    auto q = at::empty({n, h, hd}, qkv.options());
    if (n == 0) return q;
    AttentionInputsArgs a{qkv.data_ptr<float>(), q_norm.has_value() ? q_norm->data_ptr<float>() : nullptr,
                          k_norm.has_value() ? k_norm->data_ptr<float>() : nullptr, cos.data_ptr<float>(),
                          sin.data_ptr<float>(), positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
                          f32_of(k_cache), f32_of(v_cache), q.data_ptr<float>(),
                          n, h, kvh, hd, rope_dim, interleaved, static_cast<float>(eps), unit_offset,
                          half_of(k_cache), half_of(v_cache)};
    attention_inputs_raw(a);
    return q;
}

const char* isa_label(int isa) { return isa == ISA_AVX512 ? "avx512" : "avx2"; }

int isa_by_name(const std::string& name) {
    const int isa = name == "avx2" ? ISA_AVX2 : name == "avx512" ? ISA_AVX512 : -1;
    TORCH_CHECK(isa >= 0, "unknown ISA '", name, "' (known: avx2, avx512)");
    return isa;
}

std::string isa_name() { return isa_label(active_isa()); }

std::string fix_isa_name() { return isa_label(fix_isa()); }

bool isa_supported_by_name(const std::string& name) { return isa_supported(isa_by_name(name)); }

void set_isa_by_name(const std::string& name) {
    const SetIsa result = set_isa(isa_by_name(name));
    TORCH_CHECK(result != SET_ISA_UNSUPPORTED, "this CPU cannot run the ", name, " kernels");
    TORCH_CHECK(result != SET_ISA_FIXED, "the kernel ISA is fixed at ", isa_name(),
                " since the first kernel call; switching to ", name,
                " would change the bits behind cached KV (set AGENTKV_CPU_ISA before the process starts)");
}

void override_isa_by_name(const std::string& name) {
    TORCH_CHECK(override_isa_unchecked(isa_by_name(name)), "this CPU cannot run the ", name, " kernels");
}

}  // namespace ops
}  // namespace agentkv

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    // The kernels run without the GIL (like torch's own ops): the server's event loop keeps
    // answering while the engine thread is inside a prefill.
    const auto nogil = py::call_guard<py::gil_scoped_release>();
    m.doc() = "agentkv batch-invariant CPU kernels (AVX2/FMA, AVX-512 where the CPU has it)";
    m.def("qmatmul", &agentkv::ops::qmatmul, nogil, "x[m,k] @ dequant(w).T -> [m,n]",
          py::arg("x"), py::arg("w"), py::arg("qtype"), py::arg("n"), py::arg("k"), py::arg("int8") = false);
    m.def("interleave_rows", &agentkv::ops::interleave_rows,
          "a file's Q4_0/Q4_1/Q5_0/Q8_0/MXFP4 rows [n, row_bytes] interleaved for the int8 kernels (qtype + 2000)",
          py::arg("w"), py::arg("qtype"), py::arg("n"), py::arg("k"));
    m.def("int8_qtype_supported", &agentkv::int8_qtype_supported,
          "whether qtype has an int8-activation kernel (others take the f32 path in int8 mode)", py::arg("qtype"));
    m.def("int8_build", &agentkv::int8_build, "the int8 kernels the active ISA runs: avx512-vnni or avx2 (the same bits)");
    m.def("fma_peak_gflops", &agentkv::fma_peak_gflops, nogil,
          "f32 FMA peak of the active ISA on the kernels' threads, GFLOP/s (register fmas only, best of repeats)",
          py::arg("iterations") = 20000000, py::arg("repeats") = 5);
    m.def("isa", &agentkv::ops::isa_name, "instruction set the matmul kernels use: avx2 or avx512");
    m.def("set_isa", &agentkv::ops::set_isa_by_name,
          "choose the kernel ISA (avx2 or avx512) before the first kernel call; after it, only the same one",
          py::arg("name"));
    m.def("fix_isa", &agentkv::ops::fix_isa_name, "fix the kernel ISA now (as a kernel call would); -> its name");
    m.def("isa_fixed", &agentkv::isa_fixed, "whether a kernel call has fixed the ISA");
    m.def("isa_supported", &agentkv::ops::isa_supported_by_name, "whether this CPU runs the named ISA's kernels",
          py::arg("name"));
    m.def("override_isa_unchecked", &agentkv::ops::override_isa_by_name,
          "tests only: switch the ISA even after it is fixed (the bits of earlier results change)", py::arg("name"));
    m.def("matmul_f32", &agentkv::ops::matmul_f32, nogil, "x[m,k] @ w[n,k].T -> [m,n]", py::arg("x"), py::arg("w"));
    m.def("dequantize", &agentkv::ops::dequantize, nogil, "dequant(w) -> f32 [n,k]",
          py::arg("w"), py::arg("qtype"), py::arg("n"), py::arg("k"));
    m.def("paged_attention", &agentkv::ops::paged_attention, nogil, "paged causal attention -> [n,h,hd]",
          py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
          py::arg("row_seq"), py::arg("row_pos"), py::arg("scale"), py::arg("window") = 0,
          py::arg("softcap") = 0.0, py::arg("sinks") = py::none());
    m.def("rms_norm", &agentkv::ops::rms_norm, nogil, "RMSNorm over the last dim -> same shape",
          py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("unit_offset") = false);
    m.def("add_norm", &agentkv::ops::add_norm, nogil, "h += [rms_norm(delta, post_weight) | delta] in place; -> rms_norm(h)",
          py::arg("h"), py::arg("delta"), py::arg("weight"), py::arg("post_weight"), py::arg("eps"),
          py::arg("unit_offset") = false);
    m.def("glu", &agentkv::ops::glu, nogil, "act(x[:, :f]) * x[:, f:] -> [n, f]", py::arg("x"), py::arg("kind"));
    m.def("clamped_swiglu", &agentkv::ops::clamped_swiglu, nogil,
          "gpt-oss's (clip(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit), elementwise",
          py::arg("gate"), py::arg("up"), py::arg("alpha"), py::arg("limit"));
    m.def("attention_inputs", &agentkv::ops::attention_inputs, nogil,
          "split q|k|v, q/k norm, rope, store K/V at slots -> q [n, h, hd]",
          py::arg("qkv"), py::arg("q_norm"), py::arg("k_norm"), py::arg("cos"), py::arg("sin"),
          py::arg("positions"), py::arg("slots"), py::arg("k_cache"), py::arg("v_cache"), py::arg("num_heads"),
          py::arg("num_kv_heads"), py::arg("rope_dim"), py::arg("interleaved"), py::arg("eps"),
          py::arg("unit_offset") = false);
    agentkv::ops::bind_layer(m);
    agentkv::ops::bind_moe(m);
    agentkv::ops::bind_grouped(m);
    agentkv::ops::bind_lora(m);
    agentkv::ops::bind_recurrent(m);
    agentkv::ops::bind_sparse(m);
}
