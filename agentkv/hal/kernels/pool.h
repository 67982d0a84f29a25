// The kernels' thread pool: a parallel loop whose caller never waits for a thread that has
// not started.
//
// OpenMP (at::parallel_for) forks a team and joins it at a barrier: every op waits until the
// other thread has been scheduled, run its share and arrived. When the machine's cores are
// busy with other processes, that thread is often off-CPU for a whole time slice, and a decode
// step, which runs ~150 parallel ops, collapses 10-100x. Here the caller publishes the chunks,
// takes chunks itself until none are left, and then waits only for chunks another thread has
// already claimed (which it is running). A worker that wakes late finds nothing to do.
//
// Chunks split columns, rows or work units only, so which thread runs a chunk never changes
// a bit of the result (every kernel's per-element order is fixed inside a chunk).
#pragma once

#include <cstdint>
#include <functional>

namespace agentkv {

// body(begin, end) over [0, n) in equal chunks (a multiple of `align` elements, at least
// `grain` unless n is smaller, about `per_thread` per thread), on the calling thread and up
// to at::get_num_threads() - 1 pool workers. Returns when every chunk is done.
void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body,
                     int64_t per_thread = 4, int64_t align = 1);

}  // namespace agentkv
