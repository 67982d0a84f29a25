// Paged attention's driver: cuts each row's keys into fixed ranges (attention_impl.h), runs
// the ISA's unit on each (row, kv head, head run, range) and merges a row's ranges in
// ascending order. Three ways to hand out the work, with the same arithmetic per row:
//
//   tiles   (prefill, wide batches): up to ROW_TILE consecutive rows of one sequence walk
//           the ranges together, so each range's K and V (KEY_RANGE keys) is loaded into
//           the cache once for all of them, not once per row; each row merges as it goes.
//           The tile's rows that attend the same keys of a range (all but a causal or a
//           window edge) run in one call of the ISA's many-query unit, which loads each K
//           and V row once for all their heads.
//   split   (a few long rows, e.g. one decode row): every (unit, range) is its own task, so
//           one row uses every thread; the partials are then merged in range order.
//   shared  (a decode step of sequences on one cached prefix: a fleet of agents on one system
//           prompt): the rows whose range lies in the same blocks run it in one call of the
//           many-query unit, which loads its K and V once for all of them, not once per
//           agent; each row's other ranges run alone; the partials are merged as in split.
//           Five SmolLM2 agents on a 2,048-key prompt, 30 layers' step, f16 K/V, 2 threads
//           (tools/fleet_attention.py, best steps): 7.7-8.2 -> 6.4-6.5 ms with 20 keys each of
//           their own, 11.9-13.1 -> 10.5-10.9 ms with 900 (AVX2 build: 10.7-11.0 -> 8.4-8.5,
//           15.9-16.8 -> 14.0-14.1).
//
// The merge of ranges 0..R-1 of one (row, head), state (M, L, O[hd]) starting as range 0's
// own (m, l, acc); for each later range, in order:
//   M' = max(M, m);  a = exp(M - M'), b = exp(m - M');  L = L*a + l*b;  O = O*a + acc*b
// then out = O / L (a head's sink, where it has one, joins as a last term: `finish`). Neither the tile, the thread that ran a range nor the mode changes a
// row's ranges, their order or this arithmetic: the bits depend on the row alone.
//
// Key position p of sequence s lives in block block_tables[s][p / block_size] at offset
// p % block_size:
//
//   keys      0 ........ start ............ pos      (start = pos - window + 1 if window)
//                        |<---- attended ---->|

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "attention_impl.h"
#include "pool.h"
#include "qmatmul.h"
#include "qmatmul_impl.h"

namespace agentkv {
namespace {

constexpr int64_t ROW_TILE = 16;  // rows of one sequence sharing each loaded key range
constexpr int MAX_HEADS = 4;      // the widest ISA's heads per unit

struct Tile {
    int64_t row0, rows, max_len;  // rows row0 .. row0+rows-1, all of one sequence
};

// How the call is cut: the unit, the head runs of each kv head.
struct Plan {
    const AttentionArgs& a;
    RangeUnit unit;
    int64_t group, runs, per_run;
    RangeUnit many = nullptr;  // the many-query unit, or null: one row per call
    int64_t rows_at_once = 1;  // rows per call of `many`
    int64_t h0(int64_t kv, int64_t r) const { return kv * group + r * per_run; }
    int nh(int64_t r) const { return static_cast<int>(std::min<int64_t>(per_run, group - r * per_run)); }
};

// Per-thread scratch, reused across tasks (and calls: thread_local).
struct Scratch {
    std::vector<float> s = std::vector<float>(RANGE_SCRATCH_FLOATS);
    std::vector<float> state, acc;
    std::vector<int64_t> where;
};

static inline int64_t attended_len(const AttentionArgs& a, int64_t row) {
    const int64_t pos = a.row_pos[row];
    return a.window > 0 ? std::min<int64_t>(pos + 1, a.window) : pos + 1;
}

static inline int64_t row_start(const AttentionArgs& a, int64_t row) {
    return a.row_pos[row] + 1 - attended_len(a, row);
}

// Offsets of keys first .. first+count-1 of one kv head (a block-table walk without a
// division per key), then RANGE_PAD copies of the last offset.
static void key_offsets(const AttentionArgs& a, int64_t row, int64_t kv, int64_t first, int64_t count,
                        std::vector<int64_t>& where) {
    if (static_cast<int64_t>(where.size()) < count + RANGE_PAD) where.resize(count + RANGE_PAD);
    const int32_t* table = a.block_tables + a.row_seq[row] * a.max_blocks_per_seq;
    int64_t b = first / a.block_size, off = first % a.block_size;
    for (int64_t j = 0; j < count; ++j) {
        where[j] = ((static_cast<int64_t>(table[b]) * a.block_size + off) * a.kvh + kv) * a.hd;
        if (++off == a.block_size) {
            off = 0;
            ++b;
        }
    }
    std::fill(where.begin() + count, where.begin() + count + RANGE_PAD, where[count - 1]);
}

// Merges one range's partial into a (row, head) state [M, L, O[hd]] (see the top).
static void merge(float* state, float m, float l, const float* acc, int64_t hd, bool first) {
    float* o = state + 2;
    if (first) {
        state[0] = m;
        state[1] = l;
        std::copy(acc, acc + hd, o);
        return;
    }
    const float mx = std::max(state[0], m);
    const float wa = std::exp(state[0] - mx), wb = std::exp(m - mx);
    state[0] = mx;
    state[1] = state[1] * wa + l * wb;
    for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * wa + acc[d] * wb;
}

// out = O / L, after the head's sink (a learned logit in the denominator only, gpt-oss)
// joins the merged state as one last term: M' = max(M, sink); L = L*a + exp(sink - M');
// O = O*a with a = exp(M - M'). It comes after every range, so it never moves a row's bits.
static void finish(const float* state, int64_t hd, float* out, const float* sink) {
    if (sink == nullptr) {
        for (int64_t d = 0; d < hd; ++d) out[d] = state[2 + d] / state[1];
        return;
    }
    const float mx = std::max(state[0], *sink), wa = std::exp(state[0] - mx);
    const float l = state[1] * wa + std::exp(*sink - mx);
    for (int64_t d = 0; d < hd; ++d) out[d] = state[2 + d] * wa / l;
}

static inline const float* sink_of(const AttentionArgs& a, int64_t head) {
    return a.sinks == nullptr ? nullptr : a.sinks + head;
}

// The unit over keys [r0, r1) of `row`, heads of run r of kv head kv; `where` holds their
// offsets (and RANGE_PAD more). Writes m, l [nh] and acc [nh, hd].
static void run_range(const Plan& p, int64_t row, int64_t kv, int64_t r, const int64_t* where, int64_t len,
                      Scratch& sc, float* m, float* l, float* acc) {
    const AttentionArgs& a = p.a;
    const int nh = p.nh(r);
    const float* q[MAX_HEADS];
    float* accs[MAX_HEADS];
    for (int hh = 0; hh < nh; ++hh) {
        q[hh] = a.q + (row * a.h + p.h0(kv, r) + hh) * a.hd;
        accs[hh] = acc + hh * a.hd;
    }
    p.unit(a, nh, q, where, len, sc.s.data(), m, l, accs);
}

// Keys [r0, r1) of range k for `row` (empty when the row attends none of the range).
static inline void range_keys(const AttentionArgs& a, int64_t row, int64_t k, int64_t& r0, int64_t& r1) {
    r0 = std::max(k * KEY_RANGE, row_start(a, row));
    r1 = std::min<int64_t>((k + 1) * KEY_RANGE, a.row_pos[row] + 1);
}

// Rows row0 .. row0+rows-1, all attending the same `len` keys at `where`, through the
// many-query unit (rows > 1) or the one-row unit: m, l [rows * nh], acc [rows * nh, hd].
static void run_rows(const Plan& p, int64_t row0, int64_t rows, int64_t kv, int64_t r, const int64_t* where,
                     int64_t len, Scratch& sc, float* m, float* l, float* acc) {
    if (rows == 1) {
        run_range(p, row0, kv, r, where, len, sc, m, l, acc);
        return;
    }
    const AttentionArgs& a = p.a;
    const int nh = p.nh(r);
    const float* q[MAX_QUERIES];
    float* accs[MAX_QUERIES];
    for (int64_t i = 0; i < rows; ++i)
        for (int hh = 0; hh < nh; ++hh) {
            q[i * nh + hh] = a.q + ((row0 + i) * a.h + p.h0(kv, r) + hh) * a.hd;
            accs[i * nh + hh] = acc + (i * nh + hh) * a.hd;
        }
    p.many(a, static_cast<int>(rows * nh), q, where, len, sc.s.data(), m, l, accs);
}

// Tiles mode: the rows of `t` walk kv head kv's ranges together, merging as they go; runs of
// rows with the same keys in a range share one call (Plan::rows_at_once at most).
static void run_tile(const Plan& p, const Tile& t, int64_t kv, int64_t r, Scratch& sc) {
    const AttentionArgs& a = p.a;
    const int nh = p.nh(r);
    const int64_t stride = a.hd + 2;
    int64_t lo = row_start(a, t.row0), hi = 0;
    for (int64_t i = 0; i < t.rows; ++i) {
        lo = std::min(lo, row_start(a, t.row0 + i));
        hi = std::max<int64_t>(hi, a.row_pos[t.row0 + i] + 1);
    }
    key_offsets(a, t.row0, kv, lo, hi - lo, sc.where);
    sc.state.resize(t.rows * nh * stride);
    sc.acc.resize(p.rows_at_once * nh * a.hd);
    if (p.rows_at_once > 1) sc.s.resize(std::max<size_t>(sc.s.size(), p.rows_at_once * nh * (KEY_RANGE + 16)));
    float m[MAX_QUERIES], l[MAX_QUERIES];
    for (int64_t k = lo / KEY_RANGE; k * KEY_RANGE < hi; ++k) {
        for (int64_t i = 0, rows = 1; i < t.rows; i += rows) {
            int64_t r0, r1, s0, s1;
            range_keys(a, t.row0 + i, k, r0, r1);
            rows = 1;
            if (r0 >= r1) continue;
            while (rows < p.rows_at_once && i + rows < t.rows) {
                range_keys(a, t.row0 + i + rows, k, s0, s1);
                if (s0 != r0 || s1 != r1) break;
                ++rows;
            }
            run_rows(p, t.row0 + i, rows, kv, r, sc.where.data() + (r0 - lo), r1 - r0, sc, m, l, sc.acc.data());
            for (int64_t b = 0; b < rows; ++b)
                for (int hh = 0; hh < nh; ++hh) {
                    const int64_t u = b * nh + hh;
                    merge(sc.state.data() + ((i + b) * nh + hh) * stride, m[u], l[u], sc.acc.data() + u * a.hd, a.hd,
                          r0 == row_start(a, t.row0 + i + b));
                }
        }
    }
    for (int64_t i = 0; i < t.rows; ++i)
        for (int hh = 0; hh < nh; ++hh)
            finish(sc.state.data() + (i * nh + hh) * stride, a.hd, a.out + ((t.row0 + i) * a.h + p.h0(kv, r) + hh) * a.hd,
                   sink_of(a, p.h0(kv, r) + hh));
}

// Consecutive rows of one sequence, at most ROW_TILE each, longest first (threads stay
// balanced when rows differ in length or a thread is descheduled).
static std::vector<Tile> make_tiles(const AttentionArgs& a) {
    std::vector<Tile> tiles;
    for (int64_t row = 0; row < a.n; ++row) {
        Tile* last = tiles.empty() ? nullptr : &tiles.back();
        if (last != nullptr && last->rows < ROW_TILE && a.row_seq[last->row0] == a.row_seq[row]) {
            ++last->rows;
            last->max_len = std::max(last->max_len, attended_len(a, row));
        } else {
            tiles.push_back({row, 1, attended_len(a, row)});
        }
    }
    std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) { return x.max_len > y.max_len; });
    return tiles;
}

static int64_t first_range(const AttentionArgs& a, int64_t row) { return row_start(a, row) / KEY_RANGE; }
static int64_t num_ranges(const AttentionArgs& a, int64_t row) {
    return a.row_pos[row] / KEY_RANGE - first_range(a, row) + 1;
}

// Split and shared modes' last pass: every (row, kv head, run) u (row-major, as the units
// are numbered) merges its ranges' partials, part(u, i) for the row's i-th range, in range
// order and writes its heads.
template <typename Part>
static void merge_partials(const Plan& p, const Part& part) {
    const AttentionArgs& a = p.a;
    const int64_t per_row = a.kvh * p.runs;
    parallel_chunks(a.n * per_row, 1, [&](int64_t b, int64_t e) {
        thread_local Scratch sc;
        sc.state.resize(a.hd + 2);
        for (int64_t u = b; u < e; ++u) {
            const int64_t row = u / per_row, kv = (u / p.runs) % a.kvh, r = u % p.runs;
            for (int hh = 0; hh < p.nh(r); ++hh) {
                for (int64_t i = 0; i < num_ranges(a, row); ++i) {
                    const float* pt = part(u, i);
                    merge(sc.state.data(), pt[hh], pt[MAX_HEADS + hh], pt + 2 * MAX_HEADS + hh * a.hd, a.hd, i == 0);
                }
                finish(sc.state.data(), a.hd, a.out + (row * a.h + p.h0(kv, r) + hh) * a.hd, sink_of(a, p.h0(kv, r) + hh));
            }
        }
    });
}

// Split mode: every (row, kv, run, range) a task writing its partial [m, l, acc] (nh * (hd + 2)
// floats), then every (row, kv, run) merges its partials in range order.
static void run_split(const Plan& p) {
    const AttentionArgs& a = p.a;
    const int64_t units = a.n * a.kvh * p.runs, stride = MAX_HEADS * (a.hd + 2);
    std::vector<int64_t> first_task(units + 1, 0);
    for (int64_t u = 0; u < units; ++u) first_task[u + 1] = first_task[u] + num_ranges(a, u / (a.kvh * p.runs));
    std::vector<float> parts(first_task[units] * stride);
    std::vector<int64_t> task_unit(first_task[units]);
    for (int64_t u = 0; u < units; ++u) std::fill(task_unit.begin() + first_task[u], task_unit.begin() + first_task[u + 1], u);
    parallel_chunks(first_task[units], 1, [&](int64_t b, int64_t e) {
        thread_local Scratch sc;
        for (int64_t i = b; i < e; ++i) {
            const int64_t u = task_unit[i], row = u / (a.kvh * p.runs), kv = (u / p.runs) % a.kvh, r = u % p.runs;
            const int64_t k = first_range(a, row) + (i - first_task[u]), start = row_start(a, row);
            const int64_t r0 = std::max(k * KEY_RANGE, start), r1 = std::min<int64_t>((k + 1) * KEY_RANGE, a.row_pos[row] + 1);
            // when this thread's next task is the unit's next range, its keys follow in `where`:
            // the unit's value pass brings their K rows near (attention_impl.h)
            const int64_t r2 = i + 1 < e && task_unit[i + 1] == u ? std::min<int64_t>(r1 + KEY_RANGE, a.row_pos[row] + 1) : r1;
            key_offsets(a, row, kv, r0, r2 - r0, sc.where);
            float* part = parts.data() + i * stride;
            run_range(p, row, kv, r, sc.where.data(), r1 - r0, sc, part, part + MAX_HEADS, part + 2 * MAX_HEADS);
        }
    });
    merge_partials(p, [&](int64_t u, int64_t i) { return parts.data() + (first_task[u] + i) * stride; });
}

// Do keys [r0, r1) of rows x and y lie in the same blocks (the same keys, by the same offsets)?
static bool same_blocks(const AttentionArgs& a, int64_t x, int64_t y, int64_t r0, int64_t r1) {
    const int32_t* tx = a.block_tables + a.row_seq[x] * a.max_blocks_per_seq;
    const int32_t* ty = a.block_tables + a.row_seq[y] * a.max_blocks_per_seq;
    for (int64_t b = r0 / a.block_size; b <= (r1 - 1) / a.block_size; ++b)
        if (tx[b] != ty[b]) return false;
    return true;
}

// A step of single rows (one a sequence: decode) where two rows' first block is the same one:
// sequences sharing a cached prefix, e.g. agents on one system prompt.
static bool rows_share_blocks(const AttentionArgs& a, const std::vector<Tile>& tiles) {
    if (a.n < 2 || static_cast<int64_t>(tiles.size()) != a.n || a.window > 0) return false;
    for (int64_t x = 0; x < a.n; ++x)
        for (int64_t y = x + 1; y < a.n; ++y)
            if (a.row_seq[x] != a.row_seq[y] && same_blocks(a, x, y, 0, 1)) return true;
    return false;
}

// Shared mode. The rows whose range k is the same keys in the same blocks (a shared prefix's
// ranges) form a group, and each (group, kv head, run) is a task: one call of the many-query
// unit, which loads each K and V row once for all of them. Each (row, kv head, run) is a task
// for the row's other ranges, in order, in one walk of its keys (as in tiles mode, a range's
// unit prefetches the next one's K). Every task writes its partials, and every (row, kv, run)
// then merges them in range order, as in split mode: a row's ranges, their arithmetic and the
// merge are the row's alone, and so are its bits.
static void run_shared(const Plan& p) {
    const AttentionArgs& a = p.a;
    const int64_t per_row = a.kvh * p.runs, stride = MAX_HEADS * (a.hd + 2);
    std::vector<int64_t> first_part(a.n + 1, 0);
    int64_t ranges = 0;
    for (int64_t row = 0; row < a.n; ++row) {
        first_part[row + 1] = first_part[row] + num_ranges(a, row);
        ranges = std::max<int64_t>(ranges, a.row_pos[row] / KEY_RANGE + 1);
    }
    struct Group {
        int64_t k, first, rows;  // range k of members[first .. first + rows)
    };
    std::vector<Group> groups;
    std::vector<int64_t> members, todo, rest;
    std::vector<char> grouped(first_part[a.n], 0);  // per (row, range): runs in a group
    for (int64_t k = 0; k < ranges; ++k) {
        int64_t r0, r1, s0, s1;
        todo.clear();
        for (int64_t row = 0; row < a.n; ++row) {
            range_keys(a, row, k, r0, r1);
            if (r0 < r1) todo.push_back(row);
        }
        while (!todo.empty()) {
            const int64_t lead = todo.front(), first = static_cast<int64_t>(members.size());
            range_keys(a, lead, k, r0, r1);
            members.push_back(lead);
            rest.clear();
            for (size_t i = 1; i < todo.size(); ++i) {
                range_keys(a, todo[i], k, s0, s1);
                const bool joins = static_cast<int64_t>(members.size()) - first < p.rows_at_once && s0 == r0 &&
                                   s1 == r1 && same_blocks(a, lead, todo[i], r0, r1);
                (joins ? members : rest).push_back(todo[i]);
            }
            todo.swap(rest);
            const int64_t rows = static_cast<int64_t>(members.size()) - first;
            if (rows == 1) {
                members.pop_back();
                continue;
            }
            groups.push_back({k, first, rows});
            for (int64_t i = first; i < first + rows; ++i) grouped[first_part[members[i]] + k - first_range(a, members[i])] = 1;
        }
    }
    std::vector<float> parts(first_part[a.n] * per_row * stride);
    auto part_of = [&](int64_t row, int64_t k, int64_t u) {
        return parts.data() + ((first_part[row] + k - first_range(a, row)) * per_row + u) * stride;
    };
    const int64_t group_tasks = static_cast<int64_t>(groups.size()) * per_row;
    parallel_chunks(group_tasks + a.n * per_row, 1, [&](int64_t b, int64_t e) {
        thread_local Scratch sc;
        sc.s.resize(std::max<size_t>(sc.s.size(), p.rows_at_once * MAX_HEADS * (KEY_RANGE + 16)));
        float m[MAX_QUERIES], l[MAX_QUERIES];
        for (int64_t t = b; t < e; ++t) {
            const int64_t u = t % per_row, kv = u / p.runs, r = u % p.runs;
            const int nh = p.nh(r);
            int64_t r0, r1;
            if (t < group_tasks) {
                const Group& g = groups[t / per_row];
                range_keys(a, members[g.first], g.k, r0, r1);
                key_offsets(a, members[g.first], kv, r0, r1 - r0, sc.where);
                const float* q[MAX_QUERIES];
                float* accs[MAX_QUERIES];
                for (int64_t i = 0; i < g.rows; ++i)
                    for (int hh = 0; hh < nh; ++hh) {
                        q[i * nh + hh] = a.q + (members[g.first + i] * a.h + p.h0(kv, r) + hh) * a.hd;
                        accs[i * nh + hh] = part_of(members[g.first + i], g.k, u) + 2 * MAX_HEADS + hh * a.hd;
                    }
                p.many(a, static_cast<int>(g.rows * nh), q, sc.where.data(), r1 - r0, sc.s.data(), m, l, accs);
                for (int64_t i = 0; i < g.rows; ++i) {
                    float* part = part_of(members[g.first + i], g.k, u);
                    std::copy(m + i * nh, m + (i + 1) * nh, part);
                    std::copy(l + i * nh, l + (i + 1) * nh, part + MAX_HEADS);
                }
                continue;
            }
            const int64_t row = (t - group_tasks) / per_row, k0 = first_range(a, row), k1 = a.row_pos[row] / KEY_RANGE;
            const auto in_group = [&](int64_t k) { return grouped[first_part[row] + k - k0] != 0; };
            int64_t k = k0;
            while (k <= k1 && in_group(k)) ++k;
            if (k > k1) continue;
            int64_t base, end;
            range_keys(a, row, k, base, end);
            key_offsets(a, row, kv, base, a.row_pos[row] + 1 - base, sc.where);
            for (; k <= k1; ++k) {
                if (in_group(k)) continue;
                range_keys(a, row, k, r0, r1);
                float* part = part_of(row, k, u);
                run_range(p, row, kv, r, sc.where.data() + (r0 - base), r1 - r0, sc, part, part + MAX_HEADS,
                          part + 2 * MAX_HEADS);
            }
        }
    }, 16);
    merge_partials(p, [&](int64_t u, int64_t i) {
        return parts.data() + ((first_part[u / per_row] + i) * per_row + u % per_row) * stride;
    });
}

}  // namespace

// Work units: (tile or row, kv head, a run of up to the ISA's heads of its GQA group, runs of
// equal size: 4 heads go 2 + 2, not 3 + 1, on AVX2). Few units and long rows: split mode.
void paged_attention_raw(const AttentionArgs& a) {
    const bool wide = fix_isa() == ISA_AVX512;
    const int64_t at_once = wide ? avx512::HEADS_AT_ONCE : avx2::HEADS_AT_ONCE;
    const int64_t group = a.h / a.kvh, threads = std::max(1, at::get_num_threads());
    const RangeUnit unit = wide ? avx512::attend_range : avx2::attend_range;
    const std::vector<Tile> tiles = make_tiles(a);
    int64_t runs = (group + at_once - 1) / at_once;
    const int64_t units = static_cast<int64_t>(tiles.size()) * a.kvh * runs;
    // `runs` head runs a kv head; the many-query unit takes up to ROW_TILE rows a call
    const auto plan = [&](int64_t head_runs) {
        Plan p{a, unit, group, head_runs, (group + head_runs - 1) / head_runs};
        p.many = wide ? avx512::attend_range_many : avx2::attend_range_many;
        p.rows_at_once = std::min<int64_t>(ROW_TILE, MAX_QUERIES / p.per_run);
        return p;
    };
    if (rows_share_blocks(a, tiles)) {
        run_shared(plan(runs));
        return;
    }
    bool long_rows = false;
    for (int64_t row = 0; row < a.n && !long_rows; ++row) long_rows = num_ranges(a, row) > 1;
    if (units < 2 * threads && long_rows && threads > 1) {
        run_split(plan(runs));
        return;
    }
    // Fewer units than threads (short decode rows of a model with one kv head): split the
    // GQA group so every thread has one; a head's bits never depend on its run.
    const int64_t rows_kv = static_cast<int64_t>(tiles.size()) * a.kvh;
    if (rows_kv < threads) runs = std::max(runs, std::min(group, (threads + rows_kv - 1) / rows_kv));
    const Plan p = plan(runs);
    parallel_chunks(rows_kv * runs, 1, [&](int64_t b, int64_t e) {
        thread_local Scratch sc;
        for (int64_t i = b; i < e; ++i) run_tile(p, tiles[i / (a.kvh * runs)], (i / runs) % a.kvh, i % runs, sc);
    }, 16);
}

}  // namespace agentkv
