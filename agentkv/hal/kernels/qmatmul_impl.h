// What the matmul driver (qmatmul.cpp: threads, dispatch) shares with the per-ISA kernels.
#pragma once

#include <cstdint>

#include "qmatmul.h"

namespace agentkv {

// Shape of one call. `k` is a multiple of 32 (x is padded by the caller for f32 weights);
// `row_bytes` is the byte stride between weight rows.
struct Problem {
    const float* x;
    const uint8_t* w;
    float* out;
    int64_t m, n, k, row_bytes;
};

// The AVX-512 build (qmatmul512.cpp, compiled for avx512f/bw/vl/dq whatever the global flags).
// Its accumulation order is the AVX2 one with 16 lanes instead of 8: for output (r, c),
// acc = 0 (16 lanes); for each 16-wide chunk j of k in order, acc = fma(x[r, 16j..),
// w[c, 16j..), acc); out = the fixed lane tree of reduce4 in qmatmul512.cpp. Decode and prefill both
// follow it, so rows stay batch-invariant; the bits differ from the AVX2 build's, which is
// why one process uses one ISA for everything (see active_isa in qmatmul.cpp).
namespace avx512 {
// The most rows qmatmul_raw sends to decode_range on this build (more: prefill panels).
constexpr int64_t DECODE_MAX_ROWS = 48;
bool cpu_supports();
// Columns [c0, c1) of out for all m rows, each weight block decoded in registers once per
// group of <= 8 rows (the driver sends m <= DECODE_MAX_ROWS here).
void decode_range(const Problem& p, int qtype, int64_t c0, int64_t c1);
// Columns per prefill panel for this k (a multiple of the register tile's width).
int64_t panel_cols(int64_t k);
// Columns [c0, c0 + cols) for all m rows: decode the panel into `scratch`
// (panel_cols(k) * k floats), then register tiles sweep it.
void prefill_panel(const Problem& p, int qtype, int64_t c0, int64_t cols, float* scratch);
// `iterations` rounds of independent 16-lane fmas (the FMA peak's loop); returns the flops done.
double fma_loop(int64_t iterations);

// Attention (attention512.cpp; its unit is declared in attention_impl.h): query heads per
// unit (one kv head) and how far ahead K and V rows are prefetched.
constexpr int HEADS_AT_ONCE = 4;
constexpr int PREFETCH_KEYS = 16;
}  // namespace avx512

}  // namespace agentkv
