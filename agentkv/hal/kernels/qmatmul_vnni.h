// What the matmul driver (qmatmul.cpp) shares with the int8-activation build (qmatmul_vnni.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "qmatmul_impl.h"

namespace agentkv {
namespace vnni {

// Rows of activations rounded to int8 per 32-wide block, with what the dot products need,
// k padded to a multiple of 64 with zero blocks (ld_q = that padded k, ld_lane = ld_q / 4):
//   q    [m, ld_q]     int8 codes, round-to-nearest-even of x / d, d = max|x| / 127 of its block
//   init [m, ld_lane]  -OFF * (the sum of codes 4l .. 4l + 4): the format's code offset, folded in
//   dx   [m, ld_lane]  d of the block lane l lies in
//   xs   [m, ld_lane]  dx * (that 4-sum), for formats whose weights have a min
struct QuantRows {
    int8_t* q;
    int32_t* init;
    float *dx, *xs;
    int64_t ld_q, ld_lane;

    QuantRows offset(int64_t r) const {
        return {q + r * ld_q, init + r * ld_lane, dx + r * ld_lane, xs + r * ld_lane, ld_q, ld_lane};
    }
};

// The buffers a QuantRows points into, sized for m rows of k (reused across calls).
struct RowBuffers {
    std::vector<int8_t> q;
    std::vector<int32_t> init;
    std::vector<float> dx, xs;

    QuantRows size_for(int64_t m, int64_t k) {
        const int64_t ld_q = (k + 63) / 64 * 64, ld_lane = ld_q / 4;
        q.resize(m * ld_q);
        init.resize(m * ld_lane);
        dx.resize(m * ld_lane);
        xs.resize(m * ld_lane);
        return {q.data(), init.data(), dx.data(), xs.data(), ld_q, ld_lane};
    }
};

bool cpu_supports();             // AVX-512 F/BW/VL/DQ and VNNI
bool qtype_supported(int qtype);  // Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4
int offset_of(int qtype);         // the format's code offset (OFF above); -1 if unsupported
// Rows [r0, r1) of x [*, k] into out (which holds all rows).
void quantize_rows(const float* x, int64_t r0, int64_t r1, int64_t k, int off, const QuantRows& out);
// Columns [c0, c1) of p.out for all p.m rows of x.
void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1);

}  // namespace vnni
}  // namespace agentkv
