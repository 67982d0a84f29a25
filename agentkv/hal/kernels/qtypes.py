"""The gguf quant types the compiled kernels accept, with their block geometry."""

from __future__ import annotations

# qtype -> (weights per block, bytes per block); 0 is f32 (handled by matmul_f32). 1 F16 and
# 30 BF16 ride the quant kernels as 32-weight blocks; 1004/1008/1016 are agentkv's own
# group-32 blocks (agentkv.formats.quants.group32).
QTYPE_BLOCK: dict[int, tuple[int, int]] = {
    1: (32, 64),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    30: (32, 64),  # BF16
    39: (32, 17),  # MXFP4
    1004: (32, 24),  # I4G32
    1008: (32, 40),  # I8G32
    1016: (32, 36),  # F8G32
    2002: (32, 18),  # Q4_0, Q4_1, Q5_0, Q8_0 and MXFP4 rows interleaved at load for the int8 kernels (INTERLEAVED)
    2003: (32, 20),
    2006: (32, 22),
    2008: (32, 34),
    2039: (32, 17),
}
SUPPORTED_QTYPES = frozenset(QTYPE_BLOCK)
# The forms the CPU backend rearranges a file's rows into when its activations are int8, by the
# file's qtype + 2000: Q4_0, Q4_1, Q5_0, Q8_0, MXFP4 (qmatmul_vnni.h: each row's blocks
# interleaved 16 at a time, so a SIMD lane is a block). The same bytes per row; only the int8
# kernels and `dequantize` read them.
INTERLEAVED: dict[int, int] = {2: 2002, 3: 2003, 6: 2006, 8: 2008, 39: 2039}
FILE_QTYPE: dict[int, int] = {v: k for k, v in INTERLEAVED.items()}


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one weight row of k weights; raises ValueError for bad qtype or k."""
    if qtype not in QTYPE_BLOCK:
        raise ValueError(f"qtype {qtype} is not supported by the CPU kernels (supported: {sorted(QTYPE_BLOCK)})")
    qk, nbytes = QTYPE_BLOCK[qtype]
    if k <= 0 or k % qk:
        raise ValueError(f"k={k} must be a positive multiple of {qk} for qtype {qtype}")
    return k // qk * nbytes
