// The int8 builds' prefill sweep over packed Tiles (qmatmul_vnni.h), shared by both builds.
//
// Included INSIDE each build's own anonymous namespace (qmatmul_vnni.cpp: AVX-512 VNNI,
// qmatmul_int8.cpp: AVX2), after int8_sweep.h, the build's TILE_ROWS (the fewest rows that take
// the tiles) and its tile_cols<F, M, G>, so each
// build instantiates it with its own registers and row groups; no std:: code. No include
// guard: once per build. The build's tile_fns() hands out the *_of functions at the end.
//
// The sweep is rows_range's (int8_sweep.h): chunks of ROW_CHUNK rows, each in balanced groups
// of <= GROUP_ROWS taking turns on COL_BLOCK columns, so an output's sequence is tile_cols',
// which is the build's cols_x16's.

// Rows [0, m) of x into the Tile at base.
static void pack_tile(const QuantRows& x, int64_t m, int64_t k, uint8_t* base) {
    const Tile t = tile_at(base, m, k);
    const int64_t groups = x16_groups(k);
    for (int64_t gi = 0; gi < groups; ++gi)
        for (int64_t r = 0; r < m; ++r) {
            for (int s = 0; s < 8; ++s) std::memcpy(t.q + 64 * (8 * m * gi + m * s + r), x.q + r * x.ld_q + 512 * gi + 64 * s, 64);
            const int64_t at = 16 * (m * gi + r), slot = r * x.ld_lane + 16 * gi;
            std::memcpy(t.init + at, x.init + slot, 64);
            std::memcpy(t.dx + at, x.dx + slot, 64);
            std::memcpy(t.xs + at, x.xs + slot, 64);
        }
}

// fn(first row, rows) for each row group of chunk c, in order.
template <class Fn>
static inline void chunk_groups(int64_t m, int64_t c, Fn&& fn) {
    const int64_t r0 = c * ROW_CHUNK, chunk = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;
    const int64_t groups = (chunk + GROUP_ROWS - 1) / GROUP_ROWS;
    for (int64_t gi = 0, r = r0; gi < groups; ++gi) {
        const int64_t left = groups - gi, rows = (r0 + chunk - r + left - 1) / left;
        fn(r, rows);
        r += rows;
    }
}

// A tile's M rows over columns [c0, c1): TILE_COLUMNS streams, then single-column tails.
template <class F, int M>
static void tile_range(const Problem& p, const Tile& x, int64_t c0, int64_t c1) {
    constexpr int G = TILE_COLUMNS;
    const int64_t streams = (c1 - c0) / G;
    for (int64_t i = 0; i < streams; ++i) tile_cols<F, M, G>(p, x, c0 + i, streams);
    for (int64_t c = c0 + G * streams; c < c1; ++c) tile_cols<F, M, 1>(p, x, c, 1);
}

template <class F>
static void tile_group(const Problem& p, const Tile& x, int64_t c0, int64_t c1) {
    constexpr int R = GROUP_ROWS;  // 8 (VNNI) or 4 (AVX2): larger cases never arise
    switch (p.m) {
        case 1: tile_range<F, 1>(p, x, c0, c1); break;
        case 2: tile_range<F, 2>(p, x, c0, c1); break;
        case 3: tile_range<F, 3>(p, x, c0, c1); break;
        case 4: tile_range<F, 4>(p, x, c0, c1); break;
        case 5: tile_range<F, R < 5 ? R : 5>(p, x, c0, c1); break;
        case 6: tile_range<F, R < 6 ? R : 6>(p, x, c0, c1); break;
        case 7: tile_range<F, R < 7 ? R : 7>(p, x, c0, c1); break;
        default: tile_range<F, R < 8 ? R : 8>(p, x, c0, c1); break;
    }
}

template <class F>
static void tiled_rows(const Problem& p, uint8_t* tiles, int64_t c0, int64_t c1) {
    const int64_t row_bytes = tile_row_bytes(p.k);
    for (int64_t c = 0; c * ROW_CHUNK < p.m; ++c) {
        for (int64_t cb = c0; cb < c1; cb += COL_BLOCK) {
            const int64_t ce = cb + COL_BLOCK < c1 ? cb + COL_BLOCK : c1;
            chunk_groups(p.m, c, [&](int64_t r, int64_t rows) {
                const Problem sub{nullptr, p.w, p.out + r * p.n, rows, p.n, p.k, p.row_bytes};
                tile_group<F>(sub, tile_at(tiles + r * row_bytes, rows, p.k), cb, ce);
            });
        }
    }
}

// The build's TileFns (qmatmul_vnni.h).
static inline bool tiles_used_of(int qtype, int64_t m) { return m >= TILE_ROWS && interleaved_source(qtype) != 0; }
static inline int64_t tiles_bytes_of(int64_t m, int64_t k) { return m * tile_row_bytes(k); }
static inline int64_t tile_chunks_of(int64_t m) { return (m + ROW_CHUNK - 1) / ROW_CHUNK; }

static void pack_tiles_of(const QuantRows& x, int64_t m, int64_t k, uint8_t* tiles, int64_t c0, int64_t c1) {
    const int64_t row_bytes = tile_row_bytes(k);
    for (int64_t c = c0; c < c1; ++c)
        chunk_groups(m, c, [&](int64_t r, int64_t rows) { pack_tile(x.offset(r), rows, k, tiles + r * row_bytes); });
}

static void tiled_columns_of(const Problem& p, uint8_t* tiles, int qtype, int64_t c0, int64_t c1) {
    dispatch(qtype, [&](auto fmt) {
        using F = decltype(fmt);
        if constexpr (F::ROUND == 3) tiled_rows<F>(p, tiles, c0, c1);
    });
}
