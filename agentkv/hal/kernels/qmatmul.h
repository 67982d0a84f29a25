// Raw-pointer entry points of the compiled kernels; bindings.cpp checks tensors and calls these.
#pragma once

#include <cstdint>

namespace agentkv {

// Weights per block and bytes per block of a gguf qtype (0 = f32 as 32-float blocks).
bool qtype_info(int qtype, int& block_weights, int& block_bytes);

// The instruction set of the matmul and attention kernels: the best the CPU has unless
// set_isa chose one before the first kernel call. The first kernel call fixes it
// (fix_isa); active_isa only reports it. set_isa refuses an unknown ISA, one this CPU
// lacks, and, once fixed, any other ISA. override_isa_unchecked switches even when fixed:
// only for tests that compare the two builds on raw kernels, never for a backend.
enum Isa : int { ISA_AVX2 = 0, ISA_AVX512 = 1 };
enum SetIsa : int { SET_ISA_OK = 0, SET_ISA_UNKNOWN, SET_ISA_UNSUPPORTED, SET_ISA_FIXED };
int active_isa();
int fix_isa();
bool isa_fixed();
bool isa_supported(int isa);
SetIsa set_isa(int isa);
bool override_isa_unchecked(int isa);

// out[m, n] = x[m, k] @ dequant(w[n, row_bytes]).T; k a multiple of 32.
// int8_activations: x rounded to int8 per row and 32-wide block (256 for the K-quants),
// integer dot products (qmatmul_vnni.cpp on AVX-512 VNNI, qmatmul_int8.cpp on AVX2: the same
// bits) for the qtypes int8_qtype_supported names; other qtypes take the f32 path.
void qmatmul_raw(const float* x, const uint8_t* w, float* out, int64_t m, int64_t n, int64_t k,
                 int64_t row_bytes, int qtype, bool int8_activations = false);
bool int8_qtype_supported(int qtype);
// Which build of the int8 kernels the active ISA runs: "avx512-vnni" or "avx2" (the same bits).
const char* int8_build();

// The f32 FMA peak of the active ISA on the kernels' threads, GFLOP/s: every thread runs
// `iterations` rounds of independent register fmas (no memory traffic), best of `repeats`.
// What a prefill's matmul GFLOP/s is measured against.
double fma_peak_gflops(int64_t iterations, int repeats);

// out[n, k] = dequant(w), bit-identical to gguf.quants.dequantize.
void dequantize_raw(const uint8_t* w, float* out, int64_t n, int64_t k, int64_t row_bytes, int qtype);

// Paged causal attention; see attention.cpp for the layout and the accumulation order.
struct AttentionArgs {
    const float* q;         // [n, h, hd]
    const float* k_cache;   // [num_blocks, block_size, kvh, hd] f32 K/V, or null when f16
    const float* v_cache;   // same
    const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
    const int32_t* row_seq;  // [n]
    const int32_t* row_pos;  // [n]
    float* out;             // [n, h, hd]
    int64_t n, h, kvh, hd, block_size, max_blocks_per_seq;
    float scale, softcap;
    int64_t window;
    const uint16_t* k_half = nullptr;  // the same shape as IEEE f16 bits (k_cache null), or null
    const uint16_t* v_half = nullptr;
    const float* sinks = nullptr;  // [h] per-head logits joining each row's softmax denominator, or null
};
void paged_attention_raw(const AttentionArgs& a);

}  // namespace agentkv
