"""Witness rows of the quantized-checkpoint formats: agentkv's group-32 blocks (I4G32, I8G32,
F8G32) and the 16-bit float weights (F16, BF16), matmul and embedding against the reference.

The weights decode to the reference's own values bit for bit (tests/hal), so only the
summation order differs: the quant floor is generous, the f32 floor is what these hold."""

from __future__ import annotations

import numpy as np

from agentkv.hal.base import Backend

COSINE_FLOOR_GROUP32 = 0.9999  # = COSINE_FLOOR_QUANT: weight-only codes, f32 activations
COSINE_FLOOR_HALF = 0.99999  # = COSINE_FLOOR_F32: 16-bit weights widen exactly to f32
F16, BF16, I4G32, I8G32, F8G32 = 1, 30, 1004, 1008, 1016


def group32_weights(qtype: int, rows: int, cols: int, seed: int) -> np.ndarray:
    """uint8 [rows, row_bytes] of random codes with small scales (zero points for the ints)."""
    from agentkv.formats.quants import group32

    r = np.random.default_rng(seed)
    scale = (r.random((rows, cols // 32)) * 0.02 + 1e-3).astype(np.float32)
    if qtype == F8G32:
        codes = r.integers(0, 256, (rows, cols)).astype(np.uint8)
        codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN codes
        return group32.F8G32.encode(codes, scale, None)
    top = 16 if qtype == I4G32 else 256
    codec = group32.I4G32 if qtype == I4G32 else group32.I8G32
    zero = r.integers(0, top, (rows, cols // 32)).astype(np.float32)
    return codec.encode(r.integers(0, top, (rows, cols)).astype(np.uint8), scale, zero)


def half_weights(qtype: int, rows: int, cols: int, seed: int) -> np.ndarray:
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) / 8).astype(np.float32)
    if qtype == F16:
        return w.astype(np.float16)
    return (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits, as a safetensors file holds them


def group32_cases():
    cases = []
    for qtype, name, make, floor in [
        (I4G32, "I4G32", group32_weights, COSINE_FLOOR_GROUP32),
        (I8G32, "I8G32", group32_weights, COSINE_FLOOR_GROUP32),
        (F8G32, "F8G32", group32_weights, COSINE_FLOOR_GROUP32),
        (F16, "F16", half_weights, COSINE_FLOOR_HALF),
        (BF16, "BF16", half_weights, COSINE_FLOOR_HALF),
    ]:
        for n in (1, 19):

            def mm(be: Backend, qtype=qtype, make=make, n=n):
                wt = be.upload_weight("wg", make(qtype, 96, 256, qtype), qtype, (96, 256))
                x = np.random.default_rng(n).standard_normal((n, 256))
                return be.read(be.matmul(be.upload(x), wt))

            cases.append((f"matmul/{name}", f"[{n},256]x[96,256]", mm, floor, True))

        def emb(be: Backend, qtype=qtype, make=make):
            table = be.upload_weight("eg", make(qtype, 50, 64, qtype + 1), qtype, (50, 64))
            return be.read(be.embedding(table, np.array([3, 0, 49, 3])))

        cases.append((f"embedding/{name}", "[50,64][4]", emb, floor, False))
    return cases
