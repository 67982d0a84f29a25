"""The `cuda` backend's checks under Triton's interpreter, in a process of its own: Triton
decides at import whether it interprets, so the test process (which must not) runs this as
`TRITON_INTERPRET=1 python tests/hal/cuda_interp.py FOLDER` and reads one JSON object from
stdout. tests/hal/test_cuda_backend.py asserts on it; nothing here decides a pass.

Sections: the op witness against the reference, row invariance (alone, batched, chunked) of
every kernel with a control that breaks it, host reads during a decode step (the seventh
fence) with a control, a tiny model's logits against the reference and across splits, and a
tiny MoE model's (the grouped expert dispatch, host reads counted, with a control)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agentkv.formats.quants import quantize  # noqa: E402
from agentkv.hal.base import AttnMeta, KVSpec, Tensor  # noqa: E402
from agentkv.hal.cuda import interpreter_backend, launch  # noqa: E402
from agentkv.hal.registry import lookup  # noqa: E402
from agentkv.witness.cuda_ops import interpreter_cases  # noqa: E402
from agentkv.witness.group32_ops import group32_weights  # noqa: E402
from agentkv.witness.ops import compare, random_kquant_blocks  # noqa: E402

FORMATS = {"F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
FORMATS.update(I4G32=1004, I8G32=1008, F8G32=1016, MXFP4=39)


def witness(be, ref) -> list[dict]:
    rows = []
    for op, shape, fn, floor, check_argmax in interpreter_cases():
        rows.append(compare(op, shape, fn(ref), fn(be), floor, check_argmax)._asdict())
    return rows


def _weight(be, qtype: int, rows: int, cols: int):
    rng = np.random.default_rng(qtype)
    if qtype in (12, 13, 14):
        return be.upload_weight("w", random_kquant_blocks(qtype, rows, cols, qtype), qtype, (rows, cols))
    if qtype > 1000:
        return be.upload_weight("w", group32_weights(qtype, rows, cols, qtype), qtype, (rows, cols))
    w = (rng.standard_normal((rows, cols)) / 16).astype(np.float32)
    data = {0: w, 1: w.astype(np.float16)}.get(qtype)
    if data is None:
        data = quantize(w, qtype) if qtype != 30 else (w.view(np.uint32) >> 16).astype(np.uint16)
    return be.upload_weight("w", data, qtype, (rows, cols))


def variants_broken(fn, x: np.ndarray) -> list[str]:
    """How row i of `fn(x)` (a batch of 5) can differ: alone, or in chunks [0, 2) + [2, 5)."""
    full = fn(x)
    broken = [f"alone:{i}" for i in range(len(x)) if not np.array_equal(fn(x[i : i + 1])[0], full[i])]
    if not np.array_equal(np.concatenate([fn(x[:2]), fn(x[2:])]), full):
        broken.append("chunked")
    return broken


def invariance(be) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for name, qtype in FORMATS.items():
        w = _weight(be, qtype, 40, 256)
        x = rng.standard_normal((5, 256)).astype(np.float32)
        out[f"matmul/{name}"] = variants_broken(lambda a, w=w: be.read(be.matmul(be.upload(a), w)), x)
    g = be.upload_weight("g", rng.standard_normal(300).astype(np.float32), 0, (300,))
    x = rng.standard_normal((5, 300)).astype(np.float32)
    out["rms_norm"] = variants_broken(lambda a: be.read(be.rms_norm(be.upload(a), g, 1e-6)), x)
    out["attention"] = attention_invariance(be, rng)
    # the control: tiles chosen by the row count, as an autotuner keyed on M would
    w = _weight(be, 0, 40, 256)
    x = rng.standard_normal((5, 256)).astype(np.float32)

    def by_rows(a):
        tiles = be.tiles._replace(bk=32 if len(a) < 5 else 128)
        return be.read(Tensor(launch.matmul(tiles, be.upload(a).raw, w, None)))

    out["control/tiles_by_row_count"] = variants_broken(by_rows, x)
    return out


def attention_invariance(be, rng) -> list[str]:
    """Queries at positions 265..269 of a 270-key sequence (across the first 256-key range):
    a decode step of each, and the 5 as one chunk batched after another sequence."""
    bs, h, kvh, hd, n = 16, 4, 2, 16, 270
    kv = be.allocate_kv(KVSpec(1, 40, bs, kvh, hd))
    table = tuple(range(2, 2 + -(-n // bs)))
    slots = np.asarray(table)[np.arange(n) // bs] * bs + np.arange(n) % bs
    be.kv_store(
        kv, 0, be.upload(rng.standard_normal((n, kvh, hd))), be.upload(rng.standard_normal((n, kvh, hd))), slots
    )
    be.kv_store(
        kv,
        0,
        be.upload(rng.standard_normal((16, kvh, hd))),
        be.upload(rng.standard_normal((16, kvh, hd))),
        np.arange(16),
    )
    q = rng.standard_normal((5, h, hd)).astype(np.float32)
    pos = np.arange(n - 5, n)

    def attend(qs, meta):
        return be.read(be.attention(be.upload(qs), kv, 0, meta, 0.25))

    other = rng.standard_normal((3, h, hd)).astype(np.float32)
    meta = AttnMeta((3, 5), (16, n), ((0,), table), np.concatenate([np.arange(13, 16), pos]), np.zeros(8, np.int64))
    batched = attend(np.concatenate([other, q]), meta)[3:]
    broken = []
    for i, p in enumerate(pos):
        alone = attend(q[i : i + 1], AttnMeta((1,), (p + 1,), (table,), pos[i : i + 1], np.zeros(1, np.int64)))
        if not np.array_equal(alone[0], batched[i]):
            broken.append(f"decode:{p}")
    return broken


def dot_row_by_row() -> None:
    """Make the interpreter's `tl.dot` give each row of a tile the bits it would have alone.

    The interpreter runs a dot as one `np.matmul` over the tile. With OpenBLAS's Haswell or
    Zen kernels (every AVX2 CPU, and Zen 5 since OpenBLAS 0.3.31), a row's bits then depend
    on where it sits in the tile. A GPU's dot never does that: the H200 run of
    tools/gpu_check.py on 2026-12-04 found every split and batch equal. So each row here is
    its own `[1, K] @ [K, N]` product, one shape for every row. The invariance control
    (tiles sized by the row count) still fails under this dot."""
    from triton.runtime import interpreter as ti

    original = ti.InterpreterBuilder.create_dot
    if getattr(original, "row_by_row", False):
        return

    def create_dot(self, a, b, d, *args):
        rows = a.data.shape[-2]
        parts = [
            original(
                self,
                ti.TensorHandle(a.data[..., i : i + 1, :], a.dtype.scalar),
                b,
                ti.TensorHandle(d.data[..., i : i + 1, :], d.dtype.scalar),
                *args,
            ).data
            for i in range(rows)
        ]
        return ti.TensorHandle(np.concatenate(parts, axis=-2), d.dtype.scalar)

    create_dot.row_by_row = True
    ti.InterpreterBuilder.create_dot = create_dot


def main(folder: Path) -> None:
    from tests.hal.cuda_interp_model import fence_control, model_checks
    from tests.hal.cuda_interp_moe import GPT_OSS_PROMPT, gpt_oss, moe_checks, tiny_moe

    dot_row_by_row()
    be, ref = interpreter_backend(), lookup("reference")
    result, timings = {"identity": list(be.identity)}, {}
    for name, fn in [
        ("witness", lambda: witness(be, ref)),
        ("invariance", lambda: invariance(be)),
        ("model", lambda: model_checks(folder, be, ref)),
        ("fence_control", lambda: fence_control(folder)),
        ("moe", lambda: moe_checks(tiny_moe(folder), be, ref)),
        ("gpt_oss", lambda: moe_checks(gpt_oss(folder), be, ref, GPT_OSS_PROMPT, control=False)),
    ]:
        start = time.perf_counter()
        result[name] = fn()
        timings[name] = round(time.perf_counter() - start, 2)
    result["seconds"] = timings
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
