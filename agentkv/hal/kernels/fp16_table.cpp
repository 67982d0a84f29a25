// Fills fp16_table.h's table once, at library load, before any kernel can run.
#include "fp16_table.h"

#include <immintrin.h>

namespace agentkv {

alignas(64) float FP16_F32[65536];

namespace {
struct Fill {
    Fill() {
        for (uint32_t h = 0; h < 65536; ++h) FP16_F32[h] = _cvtsh_ss(static_cast<uint16_t>(h));
    }
} fill;
}  // namespace

}  // namespace agentkv
