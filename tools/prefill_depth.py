"""Prefill and decode speed of one fresh N-token prompt on the in-process engine, optionally
under cProfile: `python tools/prefill_depth.py N [MODEL] [--kv-cache-dtype f16] [--profile]`
(run from the checkout to measure, with `PYTHONPATH` pointing at it). Prints the KV bytes one
token costs next to the speeds."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from types import SimpleNamespace

DECODE_TOKENS = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompt_len", type=int)
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--kv-cache-dtype", default="f32", choices=("f32", "f16"), help="K/V element type")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args()
    import torch

    from agentkv.bench.common import prompt_ids
    from agentkv.bench.engine import build_engine
    from agentkv.runtime.params import SamplingParams

    torch.set_num_threads(2)
    max_len = args.prompt_len + DECODE_TOKENS + 2
    flags = SimpleNamespace(model=args.model, weights="resident", kv_cache_dtype=args.kv_cache_dtype)
    engine = build_engine(flags, prefix_cache=False, num_blocks=-(-max_len // 16) + 2, max_model_len=max_len)
    ids = prompt_ids(engine.vocab_size, args.prompt_len)
    engine.add_request("warm", ids[:32], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    prof = cProfile.Profile() if args.profile else None
    params = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    engine.add_request("depth", ids, params)
    while not engine.step():  # prefill chunks until the first token
        pass
    t1 = time.perf_counter()
    num_decoded = 0
    while engine.has_unfinished():
        num_decoded += len(engine.step())
    t2 = time.perf_counter()
    if prof:
        prof.disable()
    kv_bytes = engine.model.kv_spec(1, engine.block_size).bytes_per_token
    print(
        f"n={args.prompt_len} kv={args.kv_cache_dtype} ({kv_bytes} B/token) "
        f"prefill {args.prompt_len / (t1 - t0):.1f} tok/s ({t1 - t0:.2f} s) "
        f"decode {num_decoded / (t2 - t1):.1f} tok/s ({num_decoded} tokens)"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
