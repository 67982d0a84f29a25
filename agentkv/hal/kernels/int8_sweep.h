// The sweep of the int8-activation kernels over rows and columns, shared by both builds.
//
// Included INSIDE each build's own anonymous namespace (qmatmul_vnni.cpp: AVX-512 VNNI,
// qmatmul_int8.cpp: AVX2), after that build's format structs, its cols<F, M, G> and
// cols_super<F, M, G> and its GROUP_ROWS / COL_BLOCK / ROW_CHUNK, so each build instantiates
// it with its own registers; it uses nothing from the standard library (the VNNI build
// compiles no std:: code under its target pragma). No include guard: once per build. The
// build defines group<F> (its M -> G choice) after it.
//
// An output's sequence is its cols' whatever its group, its column block or its stream, so a
// row's bits never depend on the row count.

// One row group over columns [c0, c1): G long streams (row_groups.h's order), then
// single-column tails.
template <class F, int M, int G>
static void cols_range(const Problem& p, const QuantRows& x, int64_t c0, int64_t c1) {
    const int64_t streams = (c1 - c0) / G;
    if constexpr (F::QK == 256) {
        for (int64_t i = 0; i < streams; ++i) cols_super<F, M, G>(p, x, c0 + i, streams);
        for (int64_t c = c0 + G * streams; c < c1; ++c) cols_super<F, M, 1>(p, x, c, 1);
    } else if constexpr (F::ROUND == 3) {
        for (int64_t i = 0; i < streams; ++i) cols_x16<F, M, G>(p, x, c0 + i, streams);
        for (int64_t c = c0 + G * streams; c < c1; ++c) cols_x16<F, M, 1>(p, x, c, 1);
    } else {
        for (int64_t i = 0; i < streams; ++i) cols<F, M, G>(p, x, c0 + i, streams);
        for (int64_t c = c0 + G * streams; c < c1; ++c) cols<F, M, 1>(p, x, c, 1);
    }
}

// One group of <= GROUP_ROWS rows (the build's own, defined after this header).
template <class F>
static void group(const Problem& p, const QuantRows& x, int64_t c0, int64_t c1);

// Rows in chunks of ROW_CHUNK (their activations stay in L2), each chunk's rows in balanced
// groups of <= GROUP_ROWS taking turns on COL_BLOCK columns (those weights stay in L1); one
// group (a decode) streams its whole range.
template <class F>
static void rows_range(const Problem& p, const QuantRows& x, int64_t c0, int64_t c1) {
    if (p.m <= GROUP_ROWS) {
        group<F>(p, x, c0, c1);
        return;
    }
    for (int64_t r0 = 0; r0 < p.m; r0 += ROW_CHUNK) {
        const int64_t chunk = p.m - r0 < ROW_CHUNK ? p.m - r0 : ROW_CHUNK;
        const int64_t groups = (chunk + GROUP_ROWS - 1) / GROUP_ROWS;
        for (int64_t cb = c0; cb < c1; cb += COL_BLOCK) {
            const int64_t ce = cb + COL_BLOCK < c1 ? cb + COL_BLOCK : c1;
            int64_t r = r0;
            for (int64_t gi = 0; gi < groups; ++gi) {
                const int64_t left = groups - gi, rows = (r0 + chunk - r + left - 1) / left;
                const Problem sub{nullptr, p.w, p.out + r * p.n, rows, p.n, p.k, p.row_bytes};
                group<F>(sub, x.offset(r), cb, ce);
                r += rows;
            }
        }
    }
}

// fn(the format struct) for a qtype with an int8 kernel; false for any other.
template <class Fn>
static bool dispatch(int qtype, Fn&& fn) {
    switch (qtype) {
        case 8: fn(Q8_0{}); return true;
        case agentkv::Q4_0X: fn(Q4_0X{}); return true;  // rows interleaved at load (qmatmul_vnni.h)
        case agentkv::Q4_1X: fn(Q4_1X{}); return true;
        case agentkv::Q5_0X: fn(Q5_0X{}); return true;
        case agentkv::Q8_0X: fn(Q8_0X{}); return true;
        case agentkv::MXFP4X: fn(MXFP4X{}); return true;
        case 2: fn(Q4_0{}); return true;
        case 3: fn(Q4_1{}); return true;
        case 6: fn(Q5_0{}); return true;
        case 12: fn(Q4_K{}); return true;
        case 14: fn(Q6_K{}); return true;
        case agentkv::MXFP4: fn(MXFP4{}); return true;  // the qtype (mxfp4.h), then the format
        default: return false;
    }
}
