// Every IEEE half's f32 value, indexed by the half's bits (fp16_table.cpp fills it when the
// library loads, with the same conversion vcvtph2ps makes, so a lookup is bit-equal to it).
//
// A decoder that needs a block's fp16 scale as a broadcast then costs one 16-bit load and
// one broadcast load from here, both on the load ports; converting in registers took a
// vcvtph2ps and a shuffle per scale on the vector ports those decoders are bound by. The
// table is 256 KiB, but a model's scales use few distinct halves, so the lines in use stay
// in L1/L2. Data, not code: one copy serves both instruction-set builds.
#pragma once

#include <cstdint>
#include <cstring>

namespace agentkv {

extern float FP16_F32[65536];

// The f32 value of the little-endian half at p.
static inline float fp16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return FP16_F32[h];
}

}  // namespace agentkv
