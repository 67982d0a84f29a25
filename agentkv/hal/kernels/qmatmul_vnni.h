// What the matmul driver (qmatmul.cpp) shares with the two builds of the int8-activation
// matmul: qmatmul_vnni.cpp (AVX-512 VNNI) and qmatmul_int8.cpp (AVX2), one arithmetic and so
// the same bits, over activations rounded once by int8_rows.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "qmatmul_impl.h"

namespace agentkv {

// Rows of activations rounded to int8, with what the dot products need, k padded with zero
// blocks to what the format's kernel reads (64 in the file's order, 512 interleaved; ld_q = k
// padded to 512, ld_lane = ld_q / 4, ld_sub = ld_q / 32):
//   q    [m, ld_q]     int8 codes, round-to-nearest-even of x / d, d = max|x| / 127 of its
//                      rounding block (32 wide, or 256 for the K-quants, as llama.cpp's q8_K),
//                      in the order the format's kernel reads them (rounding_of)
//   init [m, ld_lane]  -OFF * (the sum of codes 4l .. 4l + 4): the format's code offset, folded in
//                      (32-wide rounding only)
//   dx   [m, ld_lane]  d of the block lane l lies in
//   xs   [m, ld_lane]  dx * (that 4-sum), for 32-weight formats whose weights have a min
//   sub  [m, ld_sub]   d * (the sum of the codes of k's 32-wide block j, in k order), for Q4_K's
//                      mins (256-wide rounding only, as gsum)
//   gsum [m, 2 ld_sub] the sum of the codes of k's 16-wide group j (k order), for Q6_K's offset
// except for the interleaved rows (ROUND 3: Q4_0X, Q4_1X, Q5_0X, Q8_0X, MXFP4X), whose kernel reads a 512-wide group gi's
// codes in its weights' order (block l's codes 4s .. 4s + 4 at q[512 gi + 64 s + 4 l]) and one
// init, dx and xs per 32-wide block (slot 16 gi + l of the same arrays).
struct QuantRows {
    int8_t* q;
    int32_t* init;
    float *dx, *xs, *sub;
    int16_t* gsum;
    int64_t ld_q, ld_lane, ld_sub;

    QuantRows offset(int64_t r) const {
        return {q + r * ld_q,     init + r * ld_lane, dx + r * ld_lane, xs + r * ld_lane,
                sub + r * ld_sub, gsum + 2 * r * ld_sub, ld_q, ld_lane, ld_sub};
    }
};

// The buffers a QuantRows points into, sized for m rows of k (reused across calls).
struct RowBuffers {
    std::vector<int8_t> q;
    std::vector<int32_t> init;
    std::vector<float> dx, xs, sub;
    std::vector<int16_t> gsum;

    QuantRows size_for(int64_t m, int64_t k) {
        const int64_t ld_q = (k + 511) / 512 * 512, ld_lane = ld_q / 4, ld_sub = ld_q / 32;
        q.resize(m * ld_q);
        init.resize(m * ld_lane);
        dx.resize(m * ld_lane);
        xs.resize(m * ld_lane);
        sub.resize(m * ld_sub);
        gsum.resize(2 * m * ld_sub);
        return {q.data(), init.data(), dx.data(), xs.data(), sub.data(), gsum.data(), ld_q, ld_lane, ld_sub};
    }
};

// Q4_0, Q4_1, Q5_0, Q8_0 and MXFP4 with each row's blocks interleaved 16 at a time for the int8 kernels (a
// lane is a block: qmatmul_vnni.cpp's Interleaved); the same bytes per row as the file's form.
// interleave_rows makes them from the file's rows at load (file qtype in, the X qtype's rows
// out), and only the int8 kernels and dequantize read them.
constexpr int INTERLEAVED_OFFSET = 2000;  // interleaved qtype = file qtype + this
constexpr int Q4_0X = 2002, Q4_1X = 2003, Q5_0X = 2006, Q8_0X = 2008, MXFP4X = 2039;
// The interleaved groups of a row of k weights, and the blocks of group gi (16, or fewer last).
inline int64_t x16_groups(int64_t k) { return (k / 32 + 15) / 16; }
inline int x16_blocks(int64_t k, int64_t gi) { return static_cast<int>(k / 32 - 16 * gi < 16 ? k / 32 - 16 * gi : 16); }
// The file qtype of an interleaved one; 0 if not one.
int interleaved_source(int qtype);
void interleave_rows(const uint8_t* src, uint8_t* dst, int64_t n, int64_t k, int file_qtype);
void deinterleave_row(const uint8_t* src, uint8_t* dst, int64_t k, int qtype);

// A row group's rounded activations (m rows) repacked for the int8 builds' prefill kernels
// (tile_cols), so that every load of their inner loop is a constant offset from one pointer:
// for 512-wide group gi, the 64 codes of step s for row r at q + 64 (8 m gi + m s + r)
// (QuantRows' q[r][512 gi + 64 s ..]), and the 16 init, dx and xs of the group's blocks at
// 16 (m gi + r) (QuantRows' slots 16 gi ..).
struct Tile {
    int8_t* q;
    int32_t* init;
    float *dx, *xs;
};

// The bytes one row takes in a Tile of k.
inline int64_t tile_row_bytes(int64_t k) { return x16_groups(k) * (512 + 3 * 16 * 4); }

// The Tile of m rows at `base` (64-byte aligned, m tile_row_bytes).
inline Tile tile_at(uint8_t* base, int64_t m, int64_t k) {
    const int64_t groups = x16_groups(k);
    Tile t;
    t.q = reinterpret_cast<int8_t*>(base);
    t.init = reinterpret_cast<int32_t*>(base + 512 * m * groups);
    t.dx = reinterpret_cast<float*>(t.init + 16 * m * groups);
    t.xs = t.dx + 16 * m * groups;
    return t;
}

// A prefill of the interleaved formats (more than one row group: used) goes through the tiles
// of the build that runs it (its own row groups; int8_tiles.h): every row group's activations
// packed once (pack: row chunks [c0, c1) of chunks(m), into bytes(m, k) at a 64-byte aligned
// `tiles`), then columns sweeps columns [c0, c1) over them, with the bits of that build's
// columns().
struct TileFns {
    bool (*used)(int qtype, int64_t m);
    int64_t (*bytes)(int64_t m, int64_t k);
    int64_t (*chunks)(int64_t m);
    void (*pack)(const QuantRows& x, int64_t m, int64_t k, uint8_t* tiles, int64_t c0, int64_t c1);
    void (*columns)(const Problem& p, uint8_t* tiles, int qtype, int64_t c0, int64_t c1);
};

namespace int8 {
bool qtype_supported(int qtype);  // Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4 (qmatmul_int8.cpp)
// How the format wants its activations rounded (code offset, block width, code order) as one
// key: two formats with the same key can share a rounding; -1 if unsupported.
int rounding_of(int qtype);
// Rows [r0, r1) of x [*, k] into out (which holds all rows), rounded as `rounding` says.
void quantize_rows(const float* x, int64_t r0, int64_t r1, int64_t k, int rounding, const QuantRows& out);
// Columns [c0, c1) of p.out for all p.m rows of x: the VNNI build where the process runs the
// AVX-512 build and the CPU has VNNI, else the AVX2 one (qmatmul.cpp chooses).
void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1);
}  // namespace int8

namespace vnni {
bool cpu_supports();  // AVX-512 F/BW/VL/DQ and VNNI
void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1);
TileFns tile_fns();  // this build's prefill tiles
}  // namespace vnni

namespace int8avx2 {
void columns(const Problem& p, const QuantRows& x, int qtype, int64_t c0, int64_t c1);
TileFns tile_fns();  // this build's prefill tiles
}  // namespace int8avx2
}  // namespace agentkv
