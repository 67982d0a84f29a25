// Raw-pointer entry points of the fused "glue" kernels (the small ops between the matmuls);
// bindings.cpp checks tensors and calls these. See fused.cpp for the accumulation orders.
#pragma once

#include <cstdint>

namespace agentkv {

// out[r] = (x[r] / sqrt(mean(x[r]^2) + eps)) * gain, gain = w or 1 + w; `rows` rows of d.
// out may alias x.
void rms_norm_raw(const float* x, const float* w, float* out, int64_t rows, int64_t d, float eps,
                  bool unit_offset);

// Per row: h += (post_w ? rms_norm(delta, post_w) : delta) in place, then
// normed = rms_norm(h, w). post_w may be null.
void add_norm_raw(float* h, const float* delta, const float* w, const float* post_w, float* normed,
                  int64_t rows, int64_t d, float eps, bool unit_offset);

// out[r, j] = act(x[r, j]) * x[r, f + j] for x [rows, 2f]: the fused gate|up projection.
enum GluKind : int { GLU_SILU = 0, GLU_GELU_TANH = 1 };
void glu_raw(const float* x, float* out, int64_t rows, int64_t f, int kind);

// gpt-oss's clamped SwiGLU over n elements (gate and up apart, not interleaved; out may alias
// gate): g = min(gate, limit), u = clip(up, -limit, limit), out = (u + 1) * g / (1 + exp(-alpha g)).
void clamped_swiglu_raw(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);

// Split q|k|v rows, optional per-head RMSNorm of q and k, rope, K/V into their cache slots
// (f32, or rounded to f16 to nearest even, as torch's .to(float16) rounds).
struct AttentionInputsArgs {
    const float* qkv;        // [n, (h + 2 kvh) hd]
    const float* q_norm;     // [hd] or null
    const float* k_norm;     // [hd] or null
    const float* cos;        // [num_pos, rope_dim / 2]
    const float* sin;        // same
    const int64_t* positions;  // [n], each < num_pos
    const int64_t* slots;    // [n], each < num_slots
    float* k_cache;          // [num_slots, kvh, hd] f32, or null when the cache is f16
    float* v_cache;          // same
    float* q_out;            // [n, h, hd]
    int64_t n, h, kvh, hd, rope_dim;
    bool interleaved;
    float eps;
    bool unit_offset;
    uint16_t* k_half = nullptr;  // [num_slots, kvh, hd] IEEE f16 bits (k_cache null), or null
    uint16_t* v_half = nullptr;  // same
};
void attention_inputs_raw(const AttentionInputsArgs& a);

}  // namespace agentkv
