"""A/B of the two kernel ISAs on decode, interleaved in one process (the cores are shared, so
only the ratio measured in the same run means anything): avx2 and avx512 take turns via
override_isa_unchecked (a benchmark-only switch: the bits differ between ISAs), best-of per
round, the median over rounds; prints ms per ISA and the avx2/avx512 time ratio.

    sweep  every quantized 2-D weight of MODEL's GGUF once at --m rows (the matmuls of one
           decode step, head included); --qtype keeps one weight type
    step   one engine decode step (one row after 256 cached tokens, logits read), the whole
           model: matmuls, attention, norms and the pool's fork-joins

Usage: python tools/isa_decode_ab.py [sweep|step] [--model smollm2] [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def sweep_fn(model: str, m: int, qtype: int | None) -> tuple[Callable[[], None], str]:
    import gguf
    import numpy as np
    import torch

    from agentkv.formats.resolve import resolve_model_path
    from agentkv.hal.kernels import load

    K, path = load(), resolve_model_path(model)
    mats = []
    for t in gguf.GGUFReader(str(path)).tensors:
        qt = int(t.tensor_type)
        if len(t.shape) == 2 and qt not in (0, 1) and (qtype is None or qt == qtype):
            k, n = (int(d) for d in t.shape)
            mats.append((torch.from_numpy(np.array(t.data)).view(torch.uint8).reshape(n, -1), qt, n, k))
    xs = [torch.randn(m, k) for _, _, _, k in mats]

    def run() -> None:
        for (w, qt, n, k), x in zip(mats, xs):
            K.qmatmul(x, w, qt, n, k)

    mb = sum(w.numel() for w, *_ in mats) / 1e6
    return run, f"{path.name}: {len(mats)} matrices, {mb:.1f} MB, m={m}"


def step_fn(model: str, context_len: int = 256) -> tuple[Callable[[], None], str]:
    from agentkv.bench.common import prompt_ids
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    runner = Engine(engine_config(model, enable_prefix_cache=False)).runner
    ids = prompt_ids(runner.model.vocab_size, context_len + 1)
    table = list(range((len(ids) + runner.block_size - 1) // runner.block_size))
    runner.run([Chunk(ids[:context_len], 0, table, None)])
    chunk = Chunk(ids[context_len:], context_len, table, "all")
    return lambda: runner.run([chunk]), f"{model}: one decode step after {context_len} tokens"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", choices=("sweep", "step"), default="sweep")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--qtype", type=int, default=None, help="sweep: only weights of this gguf qtype")
    args = ap.parse_args()
    import torch

    from agentkv.hal.kernels import load

    torch.set_num_threads(args.threads)
    K = load()
    fn, what = sweep_fn(args.model, args.m, args.qtype) if args.mode == "sweep" else step_fn(args.model)
    isas = [i for i in ("avx2", "avx512") if K.isa_supported(i)]
    times: dict[str, list[float]] = {i: [] for i in isas}
    for _ in range(args.rounds):
        for isa in isas:
            K.override_isa_unchecked(isa)
            fn()  # warm
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            times[isa].append(best)
    print(f"{what}; {args.threads} threads; {args.rounds} rounds, interleaved")
    for isa in isas:
        print(f"  {isa:7s} median {statistics.median(times[isa]) * 1e3:8.3f} ms")
    if len(isas) == 2:
        ratio = statistics.median(times["avx2"]) / statistics.median(times["avx512"])
        print(f"  avx2 / avx512 time ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
