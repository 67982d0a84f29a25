// The checked tensor ops of bindings.cpp, for composition in C++ (layer.cpp).
#pragma once

#include <torch/extension.h>

#include <functional>

namespace agentkv {
namespace ops {

at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t n, int64_t k, bool int8 = false);
at::Tensor matmul_f32(const at::Tensor& x, const at::Tensor& w);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& row_seq,
                           const at::Tensor& row_pos, double scale, int64_t window, double softcap,
                           const c10::optional<at::Tensor>& sinks = c10::nullopt);
at::Tensor add_norm(at::Tensor h, const at::Tensor& delta, const at::Tensor& w,
                    const c10::optional<at::Tensor>& post_w, double eps, bool unit_offset);
at::Tensor glu(const at::Tensor& x, int64_t kind);
at::Tensor attention_inputs(const at::Tensor& qkv, const c10::optional<at::Tensor>& q_norm,
                            const c10::optional<at::Tensor>& k_norm, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& slots,
                            at::Tensor k_cache, at::Tensor v_cache, int64_t h, int64_t kvh,
                            int64_t rope_dim, bool interleaved, double eps, bool unit_offset);

// Runs `check` unless the same index values and limits passed it last time at `site` (0..3;
// attention.cpp): every layer of a step passes the same indices, so they are checked once
// per step, and again whenever any value changes.
void check_indices_once(int site, std::initializer_list<at::Tensor> indices, std::initializer_list<int64_t> limits,
                        const std::function<void()>& check);

// Registers the DecoderBlock class (layer.cpp).
void bind_layer(pybind11::module_& m);
// Registers the MoEExperts class (moe.cpp).
void bind_moe(pybind11::module_& m);
// Registers head_matmuls (grouped.cpp).
void bind_grouped(pybind11::module_& m);
// Registers lora_add (lora.cpp).
void bind_lora(pybind11::module_& m);
// Registers gated_delta_rule (recurrent.cpp).
void bind_recurrent(pybind11::module_& m);
// Registers sparse_latent_attention (sparse_mla.cpp).
void bind_sparse(pybind11::module_& m);
// The f32 tensor check every op runs at its boundary (bindings.cpp).
void check_f32(const at::Tensor& t, const char* name, int64_t dim);

}  // namespace ops
}  // namespace agentkv
