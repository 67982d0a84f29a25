// The gated delta rule of Qwen3-Next / Qwen3.5's gated DeltaNet layers, over one sequence's
// rows, per value head h (state S [dk, dv], row t's q, k [dk], v [dv], decay g, beta b):
//
//     S = g S;   kv = S^T k;   delta = b (v - kv);   S = S + k delta^T;   o_t = S^T q
//
// Every column j of S stands alone (its kv, delta and o use column j only), so each row runs
// column group by column group, in one fixed arithmetic per element:
//
//     x = S[i][j] * g;  acc_j = fma(x, k[i], acc_j)        i = 0 .. dk-1 in order, acc_j from 0
//     delta_j = (v[j] - acc_j) * b
//     S[i][j] = fma(k[i], delta_j, x);  o_j = fma(S[i][j], q[i], o_j)   i in order, o_j from 0
//
// Threads split heads only, and a row's arithmetic never depends on how many rows came in the
// call, so the state after row t, and o_t, have the same bits for one prefill, chunks cut
// anywhere, any batch and any thread count (hal/recurrent.py's exactness contract). AVX2/FMA,
// dv a multiple of 8.
#include <immintrin.h>
#include <torch/extension.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "ops.h"
#include "pool.h"
#include "qmatmul.h"
#include "simd.h"

namespace agentkv {
namespace ops {
namespace {

struct Rows {
    const float *q, *k, *v, *decay, *beta;  // [n, H, dk], [n, H, dk], [n, H, dv], [n, H], [n, H]
    int64_t n, heads, dk, dv;
};

// Columns [c0, c0 + 8G) of head h's state s [dk, dv] through row t (see the header).
template <int G>
inline void columns(const Rows& r, int64_t t, int64_t h, float* s, float* out, int64_t c0) {
    const int64_t row = t * r.heads + h;
    const float *q = r.q + row * r.dk, *k = r.k + row * r.dk, *v = r.v + row * r.dv;
    const __m256 g = _mm256_set1_ps(r.decay[row]);
    __m256 acc[G];
    for (int c = 0; c < G; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < r.dk; ++i) {
        float* si = s + i * r.dv + c0;
        const __m256 ki = _mm256_set1_ps(k[i]);
        for (int c = 0; c < G; ++c) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(si + 8 * c), g);
            _mm256_storeu_ps(si + 8 * c, x);
            acc[c] = _mm256_fmadd_ps(x, ki, acc[c]);
        }
    }
    const __m256 b = _mm256_set1_ps(r.beta[row]);
    __m256 delta[G], o[G];
    for (int c = 0; c < G; ++c) {
        delta[c] = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + c0 + 8 * c), acc[c]), b);
        o[c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < r.dk; ++i) {
        float* si = s + i * r.dv + c0;
        const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
        for (int c = 0; c < G; ++c) {
            const __m256 x = _mm256_fmadd_ps(ki, delta[c], _mm256_loadu_ps(si + 8 * c));
            _mm256_storeu_ps(si + 8 * c, x);
            o[c] = _mm256_fmadd_ps(x, qi, o[c]);
        }
    }
    for (int c = 0; c < G; ++c) _mm256_storeu_ps(out + row * r.dv + c0 + 8 * c, o[c]);
}

// Six 8-wide groups at a time (acc, delta and o of six plus three broadcasts fit AVX2's 16
// registers), then what is left; the grouping never changes a bit (columns stand alone).
void one_row(const Rows& r, int64_t t, int64_t h, float* s, float* out) {
    int64_t c0 = 0;
    for (; c0 + 48 <= r.dv; c0 += 48) columns<6>(r, t, h, s, out, c0);
    switch ((r.dv - c0) / 8) {
        case 5: columns<5>(r, t, h, s, out, c0); break;
        case 4: columns<4>(r, t, h, s, out, c0); break;
        case 3: columns<3>(r, t, h, s, out, c0); break;
        case 2: columns<2>(r, t, h, s, out, c0); break;
        case 1: columns<1>(r, t, h, s, out, c0); break;
        default: break;
    }
}

}  // namespace

// -> (o [n, H, dv], the state after the last row [H, dk, dv], the states after rows `save`
// [len(save), H, dk, dv]); `state` [H, dk, dv] is the state before row 0: with `inplace` it
// becomes the state after the last row (and is that result), else it is not written.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& v, const at::Tensor& decay,
                                                                const at::Tensor& beta, const at::Tensor& state,
                                                                const at::Tensor& save, bool inplace) {
    fix_isa();  // every kernel entry fixes the ISA (qmatmul.h)
    check_f32(q, "q", 3);
    check_f32(k, "k", 3);
    check_f32(v, "v", 3);
    check_f32(decay, "decay", 2);
    check_f32(beta, "beta", 2);
    check_f32(state, "state", 3);
    const int64_t n = q.size(0), heads = q.size(1), dk = q.size(2), dv = v.size(2);
    TORCH_CHECK(k.sizes() == q.sizes(), "k has shape ", k.sizes(), ", expected q's ", q.sizes());
    TORCH_CHECK(v.size(0) == n && v.size(1) == heads, "v has shape ", v.sizes(), ", expected [", n, ", ", heads, ", dv]");
    TORCH_CHECK(dv % 8 == 0 && dv > 0, "dv=", dv, " must be a positive multiple of 8");
    for (const at::Tensor* t : {&decay, &beta})
        TORCH_CHECK(t->size(0) == n && t->size(1) == heads, "decay/beta have shape ", t->sizes(), ", expected [", n,
                    ", ", heads, "]");
    TORCH_CHECK(state.size(0) == heads && state.size(1) == dk && state.size(2) == dv, "state has shape ",
                state.sizes(), ", expected [", heads, ", ", dk, ", ", dv, "]");
    TORCH_CHECK(save.device().is_cpu() && save.scalar_type() == at::kLong && save.dim() == 1 && save.is_contiguous(),
                "save must be a contiguous int64 CPU vector");
    const int64_t num_save = save.size(0);
    const int64_t* rows = save.data_ptr<int64_t>();
    for (int64_t i = 0; i < num_save; ++i)
        TORCH_CHECK(rows[i] >= 0 && rows[i] < n && (i == 0 || rows[i] > rows[i - 1]), "save[", i, "]=", rows[i],
                    " must ascend within [0, ", n, ")");
    auto out = at::empty({n, heads, dv}, q.options());
    auto final_state = inplace ? state : state.clone();
    auto saved = at::empty({num_save, heads, dk, dv}, q.options());
    if (n == 0) return {out, final_state, saved};
    const Rows r{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), decay.data_ptr<float>(),
                 beta.data_ptr<float>(), n, heads, dk, dv};
    float *o = out.data_ptr<float>(), *s = final_state.data_ptr<float>(), *kept = saved.data_ptr<float>();
    const int64_t head_floats = dk * dv;
    parallel_chunks(heads, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            float* sh = s + h * head_floats;
            int64_t next = 0;
            for (int64_t t = 0; t < n; ++t) {
                one_row(r, t, h, sh, o);
                if (next < num_save && rows[next] == t) {
                    std::memcpy(kept + (next * heads + h) * head_floats, sh, sizeof(float) * head_floats);
                    ++next;
                }
            }
        }
    }, 1);
    return {out, final_state, saved};
}

namespace {

// sum(x^2) over n (a multiple of 8) floats: 8 lanes in order, then hsum8.
inline float sum_squares(const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    return hsum8(acc);
}

// silu(x) = x / (1 + exp(-x)), 8 lanes.
inline __m256 silu8(__m256 x) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// The shapes inputs_row needs (delta_net_inputs' arguments).
struct InputShape {
    int64_t kernel, channels, num_k, dk, num_v, dv;
    bool tiled;
};

// One row of delta_net_inputs: the conv over `rows` (its K window rows, oldest first; taps
// [K, C]), silu into `conv` [C], then q, k, v of the row (see delta_net_inputs).
inline void inputs_row(const InputShape& s, const float* const* rows, const float* w, float* conv, float* qo,
                       float* ko, float* vo) {
    for (int64_t c = 0; c < s.channels; c += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(rows[0] + c), _mm256_loadu_ps(w + c));
        for (int64_t tap = 1; tap < s.kernel; ++tap) {
            const __m256 x = _mm256_loadu_ps(rows[tap] + c);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(x, _mm256_loadu_ps(w + tap * s.channels + c)));
        }
        _mm256_storeu_ps(conv + c, silu8(acc));
    }
    const int64_t kd = s.num_k * s.dk, per = s.num_v / s.num_k;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
    for (int64_t part = 0; part < 2; ++part) {  // q, then k
        float* dst = part == 0 ? qo : ko;
        for (int64_t hk = 0; hk < s.num_k; ++hk) {
            const float* x = conv + part * kd + hk * s.dk;
            const float inv = 1.0f / std::sqrt(sum_squares(x, s.dk) + 1e-6f);
            const __m256 scale = _mm256_set1_ps(part == 0 ? inv * q_scale : inv);
            for (int64_t j = 0; j < s.num_v; ++j) {
                if ((s.tiled ? j % s.num_k : j / per) != hk) continue;
                for (int64_t i = 0; i < s.dk; i += 8)
                    _mm256_storeu_ps(dst + j * s.dk + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), scale));
            }
        }
    }
    std::memcpy(vo, conv + 2 * kd, sizeof(float) * s.num_v * s.dv);
}

// One head of one row of gated_rms_norm: x, z, y [dv].
inline void gated_norm_head(const float* x, const float* z, const float* w, float eps, int64_t dv, float* y) {
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(sum_squares(x, dv) / static_cast<float>(dv) + eps));
    for (int64_t i = 0; i < dv; i += 8) {
        const __m256 normed = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(normed, silu8(_mm256_loadu_ps(z + i))));
    }
}

}  // namespace

// A gated DeltaNet layer's inputs to the delta rule, row by row in one fixed order: the causal
// depthwise conv over q|k|v (window [K - 1 + n, C]: the conv state, then the rows; taps
// [K, C]; per channel x0 w0 + x1 w1 + ... in tap order, a multiply and an add each), silu,
// then per key head q and k divided by sqrt(sum of squares + 1e-6) (and q times 1/sqrt(dk)),
// repeated to the value heads (value head j reads key head j % num_k when `tiled`, else
// j / (num_v / num_k)). -> (q [n, num_v, dk], k [n, num_v, dk], v [n, num_v, dv]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> delta_net_inputs(const at::Tensor& window, const at::Tensor& taps,
                                                                int64_t num_k, int64_t dk, int64_t num_v,
                                                                int64_t dv, bool tiled) {
    fix_isa();
    check_f32(window, "window", 2);
    check_f32(taps, "taps", 2);
    const int64_t kernel = taps.size(0), channels = taps.size(1), n = window.size(0) - (kernel - 1);
    TORCH_CHECK(window.size(1) == channels, "window has ", window.size(1), " channels, taps ", channels);
    TORCH_CHECK(n >= 0, "window has ", window.size(0), " rows, fewer than the conv state's ", kernel - 1);
    TORCH_CHECK(num_k > 0 && num_v % num_k == 0 && dk % 8 == 0 && dv % 8 == 0, "num_v=", num_v,
                " must be a multiple of num_k=", num_k, ", dk=", dk, " and dv=", dv, " multiples of 8");
    TORCH_CHECK(channels == 2 * num_k * dk + num_v * dv, "taps have ", channels, " channels, expected 2 * ", num_k,
                " * ", dk, " + ", num_v, " * ", dv);
    auto q = at::empty({n, num_v, dk}, window.options());
    auto k = at::empty({n, num_v, dk}, window.options());
    auto v = at::empty({n, num_v, dv}, window.options());
    if (n == 0) return {q, k, v};
    const float *win = window.data_ptr<float>(), *w = taps.data_ptr<float>();
    const InputShape shape{kernel, channels, num_k, dk, num_v, dv, tiled};
    float *qo = q.data_ptr<float>(), *ko = k.data_ptr<float>(), *vo = v.data_ptr<float>();
    parallel_chunks(n, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> conv(channels);
        std::vector<const float*> rows(kernel);
        for (int64_t t = t0; t < t1; ++t) {
            for (int64_t tap = 0; tap < kernel; ++tap) rows[tap] = win + (t + tap) * channels;
            inputs_row(shape, rows.data(), w, conv.data(), qo + t * num_v * dk, ko + t * num_v * dk, vo + t * num_v * dv);
        }
    }, 1);
    return {q, k, v};
}

// The gated RMSNorm after the delta rule: per row and value head,
// y = (o / sqrt(mean(o^2) + eps)) * w * (z / (1 + exp(-z))). o [n, H, dv], z [n, H * dv].
at::Tensor gated_rms_norm(const at::Tensor& o, const at::Tensor& z, const at::Tensor& w, double eps) {
    fix_isa();
    check_f32(o, "o", 3);
    check_f32(z, "z", 2);
    check_f32(w, "weight", 1);
    const int64_t n = o.size(0), heads = o.size(1), dv = o.size(2);
    TORCH_CHECK(z.size(0) == n && z.size(1) == heads * dv, "z has shape ", z.sizes(), ", expected [", n, ", ",
                heads * dv, "]");
    TORCH_CHECK(w.size(0) == dv && dv % 8 == 0, "weight has ", w.size(0), " entries, expected dv=", dv,
                " (a multiple of 8)");
    auto y = at::empty({n, heads * dv}, o.options());
    const float *op = o.data_ptr<float>(), *zp = z.data_ptr<float>(), *wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float e = static_cast<float>(eps);
    parallel_chunks(n * heads, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) gated_norm_head(op + r * dv, zp + r * dv, wp, e, dv, yp + r * dv);
    }, 1);
    return y;
}

// A decode step of a gated DeltaNet layer: n sequences of one row each, every one with its own
// conv state convs[i] [K - 1, C] and recurrent state recs[i] [Hv, dk, dv] (written: it becomes
// the state after the row). Row i goes through the ops above with their per-element
// arithmetic (inputs_row over the window convs[i] then qkv[i], one_row per head, then
// gated_norm_head), so its bits are those of delta_net_inputs, gated_delta_rule and
// gated_rms_norm called on it, in one call and one parallel loop over (row, head).
// -> (y [n, Hv * dv], the conv states after the rows [n, K - 1, C]).
std::tuple<at::Tensor, at::Tensor> delta_net_decode(const at::Tensor& qkv, const at::Tensor& z,
                                                    const at::Tensor& decay, const at::Tensor& beta,
                                                    const at::Tensor& taps, const at::Tensor& norm, double eps,
                                                    const std::vector<at::Tensor>& convs,
                                                    const std::vector<at::Tensor>& recs, int64_t num_k, int64_t dk,
                                                    int64_t num_v, int64_t dv, bool tiled) {
    fix_isa();
    check_f32(qkv, "qkv", 2);
    check_f32(taps, "taps", 2);
    const int64_t n = qkv.size(0), kernel = taps.size(0), channels = taps.size(1);
    TORCH_CHECK(num_k > 0 && num_v % num_k == 0 && dk % 8 == 0 && dv % 8 == 0 && channels == 2 * num_k * dk + num_v * dv,
                "delta_net_decode: taps have ", channels, " channels for num_k=", num_k, ", dk=", dk, ", num_v=", num_v,
                ", dv=", dv, " (dk and dv multiples of 8)");
    TORCH_CHECK(qkv.size(1) == channels, "qkv has ", qkv.size(1), " channels, taps ", channels);
    TORCH_CHECK(static_cast<int64_t>(convs.size()) == n && static_cast<int64_t>(recs.size()) == n, "delta_net_decode: ",
                convs.size(), " conv and ", recs.size(), " recurrent states for ", n, " rows");
    for (const auto& [t, name, rows, cols] : {std::tuple{&z, "z", n, num_v * dv}, std::tuple{&decay, "decay", n, num_v},
                                              std::tuple{&beta, "beta", n, num_v}, std::tuple{&norm, "norm", dv, 1L}}) {
        check_f32(*t, name, t == &norm ? 1 : 2);
        TORCH_CHECK(t->numel() == rows * cols, name, " has shape ", t->sizes(), ", expected ", rows, " x ", cols);
    }
    for (int64_t i = 0; i < n; ++i) {
        check_f32(convs[i], "convs[i]", 2);
        check_f32(recs[i], "recs[i]", 3);
        TORCH_CHECK(convs[i].size(0) == kernel - 1 && convs[i].size(1) == channels, "convs[", i, "] has shape ",
                    convs[i].sizes(), ", expected [", kernel - 1, ", ", channels, "]");
        TORCH_CHECK(recs[i].size(0) == num_v && recs[i].size(1) == dk && recs[i].size(2) == dv, "recs[", i,
                    "] has shape ", recs[i].sizes(), ", expected [", num_v, ", ", dk, ", ", dv, "]");
    }
    auto y = at::empty({n, num_v * dv}, qkv.options());
    auto conv_after = at::empty({n, kernel - 1, channels}, qkv.options());
    auto q = at::empty({n, num_v, dk}, qkv.options()), k = at::empty({n, num_v, dk}, qkv.options());
    auto v = at::empty({n, num_v, dv}, qkv.options()), o = at::empty({n, num_v, dv}, qkv.options());
    const InputShape shape{kernel, channels, num_k, dk, num_v, dv, tiled};
    const float *x = qkv.data_ptr<float>(), *w = taps.data_ptr<float>();
    std::vector<float> conv(channels);
    std::vector<const float*> rows(kernel);
    for (int64_t i = 0; i < n; ++i) {
        const float* state = convs[i].data_ptr<float>();
        for (int64_t tap = 0; tap + 1 < kernel; ++tap) rows[tap] = state + tap * channels;
        rows[kernel - 1] = x + i * channels;
        inputs_row(shape, rows.data(), w, conv.data(), q.data_ptr<float>() + i * num_v * dk,
                   k.data_ptr<float>() + i * num_v * dk, v.data_ptr<float>() + i * num_v * dv);
        float* after = conv_after.data_ptr<float>() + i * (kernel - 1) * channels;
        for (int64_t tap = 1; tap < kernel; ++tap) std::memcpy(after + (tap - 1) * channels, rows[tap], sizeof(float) * channels);
    }
    const float *zp = z.data_ptr<float>(), *wp = norm.data_ptr<float>();
    float *op = o.data_ptr<float>(), *yp = y.data_ptr<float>();
    const float e = static_cast<float>(eps);
    parallel_chunks(n * num_v, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t i = r / num_v, h = r % num_v;
            const Rows one{q.data_ptr<float>() + i * num_v * dk, k.data_ptr<float>() + i * num_v * dk,
                           v.data_ptr<float>() + i * num_v * dv, decay.data_ptr<float>() + i * num_v,
                           beta.data_ptr<float>() + i * num_v, 1, num_v, dk, dv};
            one_row(one, 0, h, recs[i].data_ptr<float>() + h * dk * dv, op + i * num_v * dv);
            gated_norm_head(op + r * dv, zp + r * dv, wp, e, dv, yp + r * dv);
        }
    }, 1);
    return {y, conv_after};
}

void bind_recurrent(pybind11::module_& m) {
    namespace py = pybind11;
    m.def("gated_delta_rule", &gated_delta_rule, py::call_guard<py::gil_scoped_release>(),
          "gated delta rule over one sequence's rows -> (o [n,H,dv], state after the last row, states after rows save)",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("decay"), py::arg("beta"), py::arg("state"),
          py::arg("save"), py::arg("inplace") = false);
    m.def("delta_net_inputs", &delta_net_inputs, py::call_guard<py::gil_scoped_release>(),
          "conv + silu + per-head L2 norms of q|k|v rows -> (q [n,Hv,dk], k [n,Hv,dk], v [n,Hv,dv])", py::arg("window"),
          py::arg("taps"), py::arg("num_k"), py::arg("dk"), py::arg("num_v"), py::arg("dv"), py::arg("tiled"));
    m.def("delta_net_decode", &delta_net_decode, py::call_guard<py::gil_scoped_release>(),
          "a gated DeltaNet decode step of n one-row sequences (recs written) -> (y [n,Hv*dv], conv states [n,K-1,C])",
          py::arg("qkv"), py::arg("z"), py::arg("decay"), py::arg("beta"), py::arg("taps"), py::arg("norm"),
          py::arg("eps"), py::arg("convs"), py::arg("recs"), py::arg("num_k"), py::arg("dk"), py::arg("num_v"),
          py::arg("dv"), py::arg("tiled"));
    m.def("gated_rms_norm", &gated_rms_norm, py::call_guard<py::gil_scoped_release>(),
          "rms_norm(o) per head * weight * silu(z) -> [n, H*dv]", py::arg("o"), py::arg("z"), py::arg("weight"),
          py::arg("eps"));
}

}  // namespace ops
}  // namespace agentkv
