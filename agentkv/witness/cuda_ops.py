"""Witness floors and cases of the `cuda` backend (Triton kernels, hal/cuda).

On a device, `agentkv witness --backend cuda` runs every op case of `ops.py` with the floors
recorded there: the kernels take f32 activations and read the weights' own values, so only
the order of the sums differs from the reference (f32 ops COSINE_FLOOR_F32, quantized and
16-bit weights COSINE_FLOOR_QUANT, f16 KV COSINE_FLOOR_KV_F16). Under Triton's interpreter
(CI, no device) 1 - cosine measured below 1e-10 for every case here; no device run has
measured them yet, so the floors stay those of the CPU backends.

`interpreter_cases` is the subset small enough for the interpreter (which runs each program
in Python), plus attention across the 256-key ranges; the ops the cuda backend inherits from
the portable torch backend unchanged (rope, activations, layer_norm, MoE dispatch) are
witnessed there (tests/hal/test_backends.py).
"""

from __future__ import annotations

import math

from agentkv.hal.base import Backend
from agentkv.witness.ops import (
    COSINE_FLOOR_F32,
    COSINE_FLOOR_KV_F16,
    WitnessRow,
    attention_case,
    op_cases,
    with_kv_dtype,
)

MODELS = ("smollm2", "gemma3-270m")  # the whole-model witness rows of the cuda backend
# the inherited torch ops (witnessed with the torch backend) and attention shapes too slow to interpret
_NOT_INTERPRETED = ("rope", "gated_act", "layer_norm", "moe_ffn")
# DeepSeek-V3's router (sigmoid, correction bias, groups) on the grouped launch: ~1 s interpreted;
# the H200 run of tools/gpu_check.py caught the cuda dispatch dropping the bias (cosine 0.35)
_INTERPRETED_MOE = ("moe_ffn/sigmoid_groups_bias",)
_LARGE_SHAPES = ("[7,576]x[1536,576]", "[33,1536]x[576,1536]")  # ~1 s each interpreted; the small ones stay


def interpreter_cases():
    """(op, shape, run, floor, check_argmax) cases for the interpreter: see the module doc."""
    cases = [
        c
        for c in op_cases()
        if (not c[0].startswith(_NOT_INTERPRETED) or c[0] in _INTERPRETED_MOE)
        and c[1] not in _LARGE_SHAPES
        and (c[0].startswith(("attention_inputs", "attention_sinks")) or not c[0].startswith("attention"))
        and "600]" not in c[1]  # a 600-key sinks case: the 270/300-key cases below cross the range already
    ]
    return cases + _interpreter_attention_cases()


def _interpreter_attention_cases():
    """Attention with few query rows (one interpreted program per row and head): GQA over
    several sequences, a window, a softcap, and 270/300 keys, whose last queries cross the
    first 256-key range into the second, with f32 and f16 K/V."""
    cases = []
    for label, h, kvh, hd, lens, q_lens, window, cap, dtype in [
        ("attention", 4, 2, 32, [5, 40], [1, 3], None, None, "f32"),
        ("attention/window=8", 2, 1, 16, [30, 9], [2, 1], 8, None, "f32"),
        ("attention/softcap=50.0", 2, 1, 32, [20], [3], None, 50.0, "f32"),
        ("attention/ranges/kv=f32", 4, 2, 16, [270, 300], [3, 2], None, None, "f32"),
        ("attention/ranges/kv=f16", 4, 2, 16, [270, 300], [3, 2], None, None, "f16"),
    ]:

        def att(be, case=((h, kvh, hd), lens, window, cap, q_lens), dtype=dtype):
            return with_kv_dtype(be, dtype, lambda: attention_case(be, 8, *case))

        floor = COSINE_FLOOR_F32 if dtype == "f32" else COSINE_FLOOR_KV_F16
        cases.append((label, f"h={h},kvh={kvh},hd={hd},lens={lens},q={q_lens}", att, floor, False))
    return cases


def model_rows(backend: Backend | None, reference: Backend, cause: str = "", models=MODELS) -> list[WitnessRow]:
    """The whole-model witness of `backend` on each packaged model; one SKIP row each, naming
    `cause`, when there is no backend (no device) or the model is not installed."""
    from agentkv.formats.errors import ModelNotFoundError
    from agentkv.witness.model import witness_model

    rows = []
    for name in models:
        skip = WitnessRow(f"model/{name}", "-", math.nan, math.nan, None, math.nan, "SKIP", cause)
        if backend is None:
            rows.append(skip)
            continue
        try:
            rows.append(witness_model(name, backend, reference))
        except ModelNotFoundError as e:
            rows.append(skip._replace(note=str(e)))
    return rows
