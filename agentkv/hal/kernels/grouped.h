// Several independent decode-sized matmuls as one parallel loop (grouped.cpp): the MoE's
// active experts (moe.cpp), MLA's per-head W_UK / W_UV products (head_matmuls) and the
// projections that read one input (qmatmuls: a hybrid's DeltaNet inputs, unfused q/k/v).
#pragma once

#include <vector>

#include "qmatmul_impl.h"

namespace agentkv {

// Columns [0, p.n) of every problem p in `jobs` (each m <= avx512::DECODE_MAX_ROWS, its own
// n, row bytes and qtype) as one parallel loop over all their columns, each column computed
// by avx512::decode_range exactly as qmatmul_raw computes it for that problem (AVX-512 only);
// with int8, the qtypes that have an int8 kernel as qmatmul_raw's int8 path computes them
// (int8_supported() must hold).
void decode_all(const std::vector<Problem>& jobs, const std::vector<int>& qtypes, bool int8 = false);

}  // namespace agentkv
