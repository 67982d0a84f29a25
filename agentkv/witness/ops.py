"""Op-by-op witness: run each backend op on random inputs against the reference backend.

Floors are recorded here, in code: an approx backend's op passes when its output's cosine
to the reference is at least the floor (and, for logits-like outputs, the argmax matches).
An op the backend cannot run is SKIP, and a SKIP is never a PASS."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, KVSpec, RopeSpec, RopeStyle, Tensor
from agentkv.hal.blocks import AttentionSpec
from agentkv.witness import group32_ops, mla_ops, sinks_ops

COSINE_FLOOR_F32 = 0.99999  # f32 ops: only summation order differs from the reference
COSINE_FLOOR_QUANT = 0.9999  # weight-only quantized kernels with f32 activations
COSINE_FLOOR_MODEL = 0.99999  # a whole forward pass, f32 weights
# Attention over an f16 KV store. The reference stores the same f16 values (rounded to
# nearest even, as the kernels' K/V store does) and widens them to f32 exactly, so only the
# summation order differs: 1 - cosine measured <= 2.4e-13 on these cases. Against a reference
# that kept f32 K/V it is ~4.5e-8, which the f32 floor would pass; this floor sits between the
# two, so it fails a backend whose rounding the reference does not reproduce.
COSINE_FLOOR_KV_F16 = 1 - 1e-10
# Quantized matmuls with int8 activations (a backend whose activation_dtype is "int8") against
# the reference's f32 activations: each row is rounded to int8 per 32-wide block, a relative
# error of up to 1/254 of the block's largest element. 1 - cosine measured 7.1e-6 .. 2.0e-5 on
# these cases (Q8_0 .. Q6_K, 1 and 19 rows; formats without an int8 kernel stay at ~1e-12),
# so the floor sits 5x below the worst of them.
COSINE_FLOOR_INT8 = 1 - 1e-4

Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, MXFP4 = 8, 2, 3, 12, 13, 14, 39


class WitnessRow(NamedTuple):
    op: str
    shape: str
    max_abs: float
    cosine: float
    argmax_match: bool | None
    floor: float
    status: str  # PASS | FAIL | SKIP
    note: str = ""


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom else float(np.array_equal(a, b))


def compare(
    op: str, shape: str, ref: np.ndarray, got: np.ndarray, floor: float, check_argmax: bool = False
) -> WitnessRow:
    if ref.shape != got.shape:
        return WitnessRow(op, shape, math.inf, 0.0, None, floor, "FAIL", f"shape {got.shape} != {ref.shape}")
    cos = cosine(ref, got)
    max_abs = float(np.max(np.abs(ref.astype(np.float64) - got))) if ref.size else 0.0
    am = bool((ref.argmax(-1) == got.argmax(-1)).all()) if check_argmax else None
    ok = cos >= floor and am is not False and np.isfinite(got).all()
    return WitnessRow(op, shape, max_abs, cos, am, floor, "PASS" if ok else "FAIL")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _w(be: Backend, arr: np.ndarray, name: str = "w"):
    return be.upload_weight(name, arr.astype(np.float32), 0, arr.shape)


def attention_case(
    be: Backend, seed: int, heads: tuple[int, int, int], lens: list[int], window: int | None, softcap: float | None,
    q_lens: list[int] | None = None,
) -> np.ndarray:  # fmt: skip
    """Sequences of `lens` keys whose last `q_lens` (a third) rows query them, heads (h, kvh, hd)."""
    (h, kvh, hd), rng, bs = heads, _rng(seed), 16
    num_blocks = sum(-(-n // bs) for n in lens) + 1
    kv = be.allocate_kv(KVSpec(1, num_blocks, bs, kvh, hd, be.kv_dtype))
    tables, next_block = [], 1
    for n in lens:
        nb = -(-n // bs)
        tables.append(tuple(range(next_block, next_block + nb)))
        next_block += nb
    # store every position's K/V, then query the last q_len rows of each sequence
    q_lens = q_lens or [max(1, n // 3) for n in lens]
    pos = np.concatenate([np.arange(n) for n in lens])
    slots = np.concatenate([np.asarray(t)[np.arange(n) // bs] * bs + np.arange(n) % bs for t, n in zip(tables, lens)])
    k = rng.standard_normal((len(pos), kvh, hd)).astype(np.float32)
    v = rng.standard_normal((len(pos), kvh, hd)).astype(np.float32)
    be.kv_store(kv, 0, be.upload(k), be.upload(v), slots)
    qpos = np.concatenate([np.arange(n - q, n) for n, q in zip(lens, q_lens)])
    meta = AttnMeta(tuple(q_lens), tuple(lens), tuple(tables), qpos.astype(np.int64), np.zeros(len(qpos), np.int64))
    q = rng.standard_normal((len(qpos), h, hd)).astype(np.float32)
    return be.read(be.attention(be.upload(q), kv, 0, meta, 1 / math.sqrt(hd), window, softcap))


def op_cases() -> list[tuple[str, str, Callable[[Backend], np.ndarray], float, bool]]:
    """(op, shape, run(backend) -> output, floor, check_argmax). Shapes include odd sizes."""
    return (
        _matmul_cases()
        + _norm_cases()
        + _rope_cases()
        + _activation_cases()
        + _attention_cases()
        + _fused_cases()
        + _quant_cases()
        + _kquant_cases()
        + _moe_cases()
        + group32_ops.group32_cases()
        + mla_ops.mla_cases()
    )


def _matmul_cases():
    cases = []
    for n, k, m in [(1, 64, 96), (7, 576, 1536), (33, 1536, 576), (5, 100, 37)]:

        def mm(be, n=n, k=k, m=m):
            r = _rng(n * 1000 + k)
            x, w = r.standard_normal((n, k)), r.standard_normal((m, k)) / math.sqrt(k)
            b = r.standard_normal(m)
            return be.read(be.matmul(be.upload(x), _w(be, w), _w(be, b, "b")))

        cases.append(("matmul", f"[{n},{k}]x[{m},{k}]", mm, COSINE_FLOOR_F32, True))
    return cases


def _norm_cases():
    cases = []
    for n, d in [(1, 576), (9, 640), (3, 33)]:

        def rms(be, n=n, d=d, unit=False):
            r = _rng(d)
            return be.read(be.rms_norm(be.upload(r.standard_normal((n, d))), _w(be, r.standard_normal(d)), 1e-6, unit))

        def ln(be, n=n, d=d):
            r = _rng(d + 1)
            return be.read(
                be.layer_norm(
                    be.upload(r.standard_normal((n, d))),
                    _w(be, r.standard_normal(d)),
                    _w(be, r.standard_normal(d), "b"),
                    1e-12,
                )
            )

        cases += [
            ("rms_norm", f"[{n},{d}]", rms, COSINE_FLOOR_F32, False),
            ("layer_norm", f"[{n},{d}]", ln, COSINE_FLOOR_F32, False),
        ]
    return cases


def _rope_cases():
    cases = []
    for style in RopeStyle:
        for scaling in (None, {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}):

            def rope(be, style=style, scaling=scaling):
                r = _rng(7)
                spec = RopeSpec(dim=64, theta=10000.0, style=style, scaling=scaling)
                pos = r.integers(0, 5000, 11)
                return be.read(be.rope(be.upload(r.standard_normal((11, 3, 64))), pos, spec))

            label = f"rope/{style.value}" + ("/llama3" if scaling else "")
            cases.append((label, "[11,3,64]", rope, COSINE_FLOOR_F32, False))
    return cases


def _activation_cases():
    cases = []
    for kind in ("silu", "gelu_tanh", "gelu"):

        def ga(be, kind=kind):
            r = _rng(3)
            return be.read(
                be.gated_act(be.upload(r.standard_normal((5, 1537))), be.upload(r.standard_normal((5, 1537))), kind)
            )

        cases.append((f"gated_act/{kind}", "[5,1537]", ga, COSINE_FLOOR_F32, False))

    def emb(be):
        r = _rng(11)
        table = r.standard_normal((301, 64))
        return be.read(be.embedding(_w(be, table), r.integers(0, 301, 17)))

    cases.append(("embedding", "[301,64][17]", emb, COSINE_FLOOR_F32, False))
    return cases


def _attention_cases():
    cases = []
    for h, kvh, hd, lens, window, cap in [
        (9, 3, 64, [37], None, None),
        (4, 1, 32, [5, 70, 16], None, None),
        (8, 4, 16, [50, 9], 8, None),
        (4, 2, 32, [40], None, 50.0),
    ]:

        def att(be, h=h, kvh=kvh, hd=hd, lens=lens, window=window, cap=cap):
            return attention_case(be, 5, (h, kvh, hd), lens, window, cap)

        label = "attention" + (f"/window={window}" if window else "") + (f"/softcap={cap}" if cap else "")
        cases.append((label, f"h={h},kvh={kvh},hd={hd},lens={lens}", att, COSINE_FLOOR_F32, False))
    for h, kvh, hd, lens in [(9, 3, 64, [37, 600]), (4, 1, 256, [300]), (4, 2, 40, [70, 5])]:

        def att16(be, h=h, kvh=kvh, hd=hd, lens=lens):
            return with_kv_dtype(be, "f16", lambda: attention_case(be, 6, (h, kvh, hd), lens, None, None))

        cases.append(("attention/kv=f16", f"h={h},kvh={kvh},hd={hd},lens={lens}", att16, COSINE_FLOOR_KV_F16, False))
    return cases + sinks_ops.sinks_cases()


def with_kv_dtype(be: Backend, dtype: str, fn: Callable[[], np.ndarray]) -> np.ndarray:
    """`fn()` with `be` allocating `dtype` KV stores, then `be`'s own kv_dtype again."""
    before = be.kv_dtype
    be.set_kv_dtype(dtype)
    try:
        return fn()
    finally:
        be.set_kv_dtype(before)


def _fused_cases():
    """The fused glue ops (add_norm, glu, attention_inputs) with odd widths and both ropes."""
    cases = []
    for post in (False, True):

        def add_norm(be, post=post):
            r = _rng(13)
            h_new, normed = be.add_norm(
                be.upload(r.standard_normal((5, 33))),
                be.upload(r.standard_normal((5, 33))),
                _w(be, r.standard_normal(33)),
                1e-6,
                post,
                _w(be, r.standard_normal(33), "p") if post else None,
            )
            return np.concatenate([be.read(h_new), be.read(normed)], axis=1)

        cases.append(("add_norm" + ("/sandwich" if post else ""), "[5,33]", add_norm, COSINE_FLOOR_F32, False))
    for kind in ("silu", "gelu_tanh"):

        def glu(be, kind=kind):
            return be.read(be.glu(be.upload(_rng(17).standard_normal((5, 2 * 1537))), kind))

        cases.append((f"glu/{kind}", "[5,3074]", glu, COSINE_FLOOR_F32, False))
    for style, dim, norm in [(RopeStyle.NEOX, 64, True), (RopeStyle.INTERLEAVED, 32, False)]:

        def inputs(be, style=style, dim=dim, norm=norm):
            r, n, h, kvh, hd = _rng(19), 7, 4, 2, 64
            kv = be.allocate_kv(KVSpec(1, 2, 16, kvh, hd, be.kv_dtype))
            slots = r.permutation(32)[:n]
            meta = AttnMeta((n,), (n,), ((0, 1),), r.integers(0, 5000, n), slots)
            qn, kn = (_w(be, r.standard_normal(hd), nm) if norm else None for nm in ("qn", "kn"))
            q = be.attention_inputs(
                be.upload(r.standard_normal((n, (h + 2 * kvh) * hd))),
                meta,
                kv,
                0,
                AttentionSpec(h, kvh, hd, RopeSpec(dim=dim, style=style), eps=1e-6),
                qn,
                kn,
            )
            k, v = (be.read(Tensor(c[0])).reshape(-1, kvh * hd)[slots] for c in (kv.k, kv.v))  # a device store too
            return np.concatenate([be.read(q).reshape(n, -1), k, v], axis=1)

        label = f"attention_inputs/{style.value}/rope_dim={dim}" + ("/qk_norm" if norm else "")
        cases.append((label, "n=7,h=4,kvh=2,hd=64", inputs, COSINE_FLOOR_F32, False))
    return cases


def _quant_cases():
    from agentkv.formats.quants import QUANTIZABLE, quantize

    cases = []
    for qtype, name in [(Q8_0, "Q8_0"), (Q4_0, "Q4_0"), (Q4_1, "Q4_1"), (MXFP4, "MXFP4")]:
        if qtype not in QUANTIZABLE:
            continue
        for n in (1, 19):

            def qmm(be, qtype=qtype, n=n):
                r = _rng(qtype * 10 + n)
                w = (r.standard_normal((96, 256)) / 16).astype(np.float32)
                raw = quantize(w, qtype)
                wt = be.upload_weight("wq", raw, qtype, (96, 256))
                return be.read(be.matmul(be.upload(r.standard_normal((n, 256))), wt))

            cases.append((f"matmul/{name}", f"[{n},256]x[96,256]", qmm, COSINE_FLOOR_QUANT, True))
    return cases


def random_kquant_blocks(qtype: int, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random K-quant rows whose f16 scale fields are small finite numbers (gguf layouts)."""
    r = _rng(seed)
    nblocks, size = cols // 256, {Q4_K: 144, Q5_K: 176, Q6_K: 210}[qtype]
    raw = r.integers(0, 256, (rows, nblocks, size), dtype=np.uint8)
    scale = lambda: (r.random((rows, nblocks)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, nblocks, 2)  # noqa: E731
    if qtype == Q6_K:
        raw[..., 208:210] = scale()
    else:
        raw[..., 0:2], raw[..., 2:4] = scale(), scale()
    return raw.reshape(rows, nblocks * size)


def _kquant_cases():
    cases = []
    for qtype, name in [(Q4_K, "Q4_K"), (Q5_K, "Q5_K"), (Q6_K, "Q6_K")]:
        for n in (1, 19):

            def kmm(be, qtype=qtype, n=n):
                raw = random_kquant_blocks(qtype, 64, 512, qtype)
                wt = be.upload_weight("wk", raw, qtype, (64, 512))
                return be.read(be.matmul(be.upload(_rng(n).standard_normal((n, 512))), wt))

            cases.append((f"matmul/{name}", f"[{n},512]x[64,512]", kmm, COSINE_FLOOR_QUANT, True))

    def qemb(be):
        from agentkv.formats.quants import quantize

        table = quantize((_rng(4).standard_normal((50, 64)) / 8).astype(np.float32), Q8_0)
        return be.read(be.embedding(be.upload_weight("e", table, Q8_0, (50, 64)), np.array([3, 0, 49, 3])))

    cases.append(("embedding/Q8_0", "[50,64][4]", qemb, COSINE_FLOOR_QUANT, False))
    return cases


def _moe_layer(be: Backend, seed: int, qtype: int, shared: bool, d: int = 64, f: int = 64, num: int = 8):
    """A random MoE FFN; the experts in `qtype` (F32 or Q8_0), the router scaled so that top-k
    choices are far from ties (every backend must pick the same experts)."""
    from agentkv.formats.quants import quantize
    from agentkv.hal.blocks import Experts, MoEFFN, Projection, SharedExpert, tiled_gate

    r = _rng(seed)

    def ex(shape, name):
        w = (r.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
        return be.upload_weight(name, quantize(w, qtype) if qtype else w, qtype, shape)

    experts = Experts(
        *(tuple(ex(shape, f"{p}{e}") for e in range(num)) for p, shape in (("g", (f, d)), ("u", (f, d)), ("d", (d, f))))
    )
    sh = (
        SharedExpert(
            Projection((_w(be, r.standard_normal((f, d)) / 8), _w(be, r.standard_normal((f, d)) / 8))),
            _w(be, r.standard_normal((d, f)) / 8),
            tiled_gate(be, _w(be, r.standard_normal((1, d)) / 8)),
        )
        if shared
        else None
    )
    return MoEFFN(_w(be, np.ones(d)), _w(be, 3.0 * r.standard_normal((num, d))), experts, sh)


def _moe_cases():
    """The expert-dispatch op: qwen2moe-like (shared expert, no renormalisation), qwen3moe/mixtral
    -like (renormalised top-k), top-k-then-softmax, and Q8_0 experts kept quantized."""
    from agentkv.hal.blocks import MoEFFNSpec, ffn_op

    cases = []
    for label, spec, qtype, shared in [
        ("moe_ffn/shared", MoEFFNSpec(8, 2, False), 0, True),
        ("moe_ffn/norm_topk", MoEFFNSpec(8, 2, True), 0, False),
        ("moe_ffn/softmax_after_topk", MoEFFNSpec(8, 3, False, softmax_after_topk=True), 0, False),
        ("moe_ffn/Q8_0", MoEFFNSpec(8, 2, True), Q8_0, True),
    ]:

        def moe(be, spec=spec, qtype=qtype, shared=shared):
            x = be.upload(_rng(23).standard_normal((21, 64)))
            return be.read(ffn_op(_moe_layer(be, 29, qtype, shared), be, x, spec))

        floor = COSINE_FLOOR_QUANT if qtype else COSINE_FLOOR_F32
        cases.append((label, "n=21,d=64,f=64,experts=8", moe, floor, False))
    return cases


def run_ops(backend: Backend, reference: Backend) -> list[WitnessRow]:
    """Every op case on `backend` against `reference`; a backend with int8 activations has its
    quantized matmuls held to COSINE_FLOOR_INT8 instead of their f32-activation floor."""
    rows = []
    int8 = backend.activation_dtype == "int8"
    for op, shape, fn, floor, check_argmax in op_cases():
        if int8 and (op.startswith("matmul/") or op == "moe_ffn/Q8_0"):  # quantized experts take int8 too
            floor = min(floor, COSINE_FLOOR_INT8)
        try:
            ref = fn(reference)
        except NotImplementedError as e:
            rows.append(WitnessRow(op, shape, math.nan, math.nan, None, floor, "SKIP", f"reference: {e}"))
            continue
        try:
            got = fn(backend)
        except NotImplementedError as e:
            rows.append(WitnessRow(op, shape, math.nan, math.nan, None, floor, "SKIP", str(e)))
            continue
        rows.append(compare(op, shape, ref, got, floor, check_argmax))
    return rows
