// Several independent decode-sized matmuls as one parallel loop (grouped.cpp): the MoE's
// active experts (moe.cpp) and MLA's per-head W_UK / W_UV products (head_matmuls).
#pragma once

#include <vector>

#include "qmatmul_impl.h"

namespace agentkv {

// Columns [0, n) of every problem in `jobs` (each m <= avx512::DECODE_MAX_ROWS, n columns,
// its own qtype) as one parallel loop over all their columns, each column computed by
// avx512::decode_range exactly as qmatmul_raw computes it for that problem (AVX-512 only);
// with int8, the qtypes that have an int8 kernel as qmatmul_raw's int8 path computes them
// (int8_supported() must hold).
void decode_all(const std::vector<Problem>& jobs, const std::vector<int>& qtypes, int64_t n, int64_t row_bytes,
                bool int8 = false);

}  // namespace agentkv
