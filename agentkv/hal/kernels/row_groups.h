// The row-group sweep of the register-decoded matmul path, shared by both ISA builds.
//
// Included INSIDE each build's own anonymous namespace (qmatmul.cpp: AVX2, qmatmul512.cpp:
// AVX-512), after that build's decode_cols<F, M, G> and GROUP_ROWS / COL_BLOCK, so each build
// instantiates it with its own registers; it uses nothing from the standard library (the
// AVX-512 build compiles no std:: code under its target pragma). No include guard: it is
// meant to be included once per build.
//
// All m rows over columns [c0, c1). One row group (m <= GROUP_ROWS, decode proper) sweeps the
// range as G long streams: call i takes columns c0 + i + g * S (S = (c1 - c0) / G), so each
// weight row it reads follows on from its stream's previous one, and the prefetchers see G
// sequential streams for the chunk's length instead of G adjacent rows that end every call
// (on a Zen 4: 33.7 against 30.3 GB/s reading 5,760-byte rows on two threads). More rows go
// in balanced groups of <= GROUP_ROWS (9 -> 5 + 4), every group sweeping the same COL_BLOCK
// columns in turn, so a block's weights are read from DRAM once and re-decoded from L1 for
// the next group. An output's fma sequence is decode_cols' whatever its group, its block,
// its G or its stream, so a row's bits never depend on m.

// One row group over columns [c0, c1): G streams, then single-column tails.
template <class F, int M, int G>
static void decode_cols_range(const Problem& p, int64_t c0, int64_t c1) {
    const int64_t streams = (c1 - c0) / G;
    for (int64_t i = 0; i < streams; ++i) decode_cols<F, M, G>(p, c0 + i, streams);
    for (int64_t c = c0 + G * streams; c < c1; ++c) decode_cols<F, M, 1>(p, c, 1);
}

// One row group (m <= GROUP_ROWS): the build's own M -> G choice (defined after this header).
template <class F>
static void decode_group(const Problem& p, int64_t c0, int64_t c1);

template <class F>
static void decode_rows(const Problem& p, int64_t c0, int64_t c1) {
    const int64_t groups = (p.m + GROUP_ROWS - 1) / GROUP_ROWS;
    if (groups == 1) {
        decode_group<F>(p, c0, c1);
        return;
    }
    for (int64_t cb = c0; cb < c1; cb += COL_BLOCK) {
        const int64_t ce = cb + COL_BLOCK < c1 ? cb + COL_BLOCK : c1;
        int64_t r0 = 0;
        for (int64_t gi = 0; gi < groups; ++gi) {
            const int64_t left = groups - gi, rows = (p.m - r0 + left - 1) / left;
            const Problem group{p.x + r0 * p.k, p.w, p.out + r0 * p.n, rows, p.n, p.k, p.row_bytes};
            decode_group<F>(group, cb, ce);
            r0 += rows;
        }
    }
}
