"""Where agentkv's time goes, for `agentkv bench quant`: cProfile of prefill and decode steps
split by kernel category, and the weight bytes a model holds resident."""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path

PROFILE_DECODE_STEPS = 32


def tensor_bytes(model) -> int:
    """Bytes of the distinct weight tensors (hal Weights) reachable from the model: what it
    holds resident. Backend caches (rope tables, step buffers) are not weights."""
    from agentkv.hal.base import Weight

    seen, storages, total, stack = set(), set(), 0, [(model, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > 6:
            continue
        seen.add(id(obj))
        if isinstance(obj, Weight):
            storage = obj.raw.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            children += [getattr(obj, s, None) for s in getattr(type(obj), "__slots__", ())]
        stack.extend((c, depth + 1) for c in children if not isinstance(c, (int, float, str, bytes)))
    return total


def profile_agentkv(engine, ids: list[int]) -> dict:
    """cProfile of one prefill step (the whole prompt) and PROFILE_DECODE_STEPS decode steps;
    then the same with each decoder block run as separate kernel calls (the composed path:
    the same kernels and bits), which is what splits a block's time by kernel."""
    result = {}
    for suffix in ("", " by kernel"):
        backend = engine.model.backend
        if suffix:
            backend._compiled_block = lambda *args: None  # instance attribute: this process only
        result.update({phase + suffix: p for phase, p in _profile_steps(engine, ids).items()})
    return result


def _profile_steps(engine, ids: list[int]) -> dict:
    from agentkv.runtime.params import SamplingParams

    engine.add_request(
        f"profile-{time.monotonic_ns()}",
        ids,
        SamplingParams(max_tokens=PROFILE_DECODE_STEPS + 1, temperature=0.0, ignore_eos=True),
    )
    result = {}
    prof = cProfile.Profile()
    prof.runcall(engine.step)
    result["prefill"] = summarize(prof)
    prof = cProfile.Profile()
    prof.enable()
    while engine.has_unfinished():
        engine.step()
    prof.disable()
    result["decode"] = summarize(prof, per=PROFILE_DECODE_STEPS)
    return result


def category(filename: str, func: str) -> str:
    """cProfile sees native calls by name; `x * y` on tensors has no entry of its own, so its
    time lands in the calling Python function's self time."""
    if "qmatmul" in func or "matmul_f32" in func or "dequantize" in func:
        return "qmatmul"
    if "paged_attention" in func:
        return "attention"
    if "agentkv_cpu_kernels.run" in func:  # DecoderBlock.run: a whole block's kernels in one call
        return "decoder blocks (matmuls, attention, glue)"
    if filename == "~":
        return "other native (torch ops, builtins)"
    return "python (incl. torch ops called through operators)"


def summarize(prof: cProfile.Profile, per: int = 1, top: int = 12) -> dict:
    """Self time per category (shares) and the top functions by self time, in ms per step."""
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values()) or 1e-12
    shares: dict[str, float] = {}
    for (filename, _, func), v in stats.items():
        cat = category(filename, func)
        shares[cat] = shares.get(cat, 0.0) + v[2] / total
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {
        "ms_per_step": 1e3 * total / per,
        "shares": {k: round(v, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
        "top": [
            {
                "function": f"{Path(f).name}:{line}:{fn}" if f != "~" else fn,
                "calls": v[1],
                "self_ms_per_step": round(1e3 * v[2] / per, 3),
            }
            for (f, line, fn), v in rows
        ],
    }
