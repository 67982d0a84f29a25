"""`agentkv bench kernels`' prefill figure: the f32 matmul GFLOP/s of a 512-row prefill against
the FMA peak of the same threads, for every ISA this CPU runs (#34: "f32 prefill GFLOP/s
against the measured FMA peak of the two cores, reported per ISA"), each ISA in a fresh
interpreter that chooses it before its first kernel call (isolate.py).

The peak is the kernels' own register loop (`fma_peak_gflops`: independent fmas, no memory
traffic, best of five) on the ISA in question; the prefill is every distinct layer matmul of the
model at m rows, timed hot, weighted by how many layers carry it (the tied output takes one row
in a prefill, so it is left out).
"""

from __future__ import annotations

from collections import Counter


def layer_shapes(weights: dict) -> Counter:
    """(qtype, n, k) -> how many layers carry it, for every quantized matrix but the output."""
    output = ("token_embd", "output")
    return Counter((qt, n, k) for name, (_, qt, n, k) in weights.items() if not name.startswith(output))


def one_isa(K, weights: dict, timer, seconds: float, m: int) -> dict:
    import torch

    shapes, by_shape = layer_shapes(weights), {}
    for w, qt, n, k in weights.values():
        by_shape.setdefault((qt, n, k), w)
    rows, flops, secs = [], 0.0, 0.0
    peak = K.fma_peak_gflops()
    for (qt, n, k), count in sorted(shapes.items()):
        x, w = torch.randn(m, k), by_shape[(qt, n, k)]
        t = timer(lambda x=x, w=w, qt=qt, n=n, k=k: K.qmatmul(x, w, qt, n, k), seconds)
        gflops = 2.0 * m * n * k / t / 1e9
        row = {"qtype": qt, "n": n, "k": k, "layers": count, "ms": t * 1e3, "gflops": gflops, "of_peak": gflops / peak}
        rows.append(row)
        flops, secs = flops + count * 2.0 * m * n * k, secs + count * t
    return {
        "isa": K.isa(),
        "fma_peak_gflops": peak,
        "shapes": rows,
        "model_gflops": flops / secs / 1e9,
        "model_of_peak": flops / secs / 1e9 / peak,
    }


def worker(spec: dict) -> dict:
    """One ISA's figure (run by isolate.py in a fresh interpreter)."""
    import torch

    from agentkv.bench.kernels import Timer, load_weights
    from agentkv.hal.kernels import load

    K = load()
    K.set_isa(spec["isa"])
    torch.set_num_threads(spec["threads"])
    return one_isa(K, load_weights()[0], Timer(spec["clock"]), spec["seconds"], spec["rows"])


def bench_peak(K, threads: int, clock: str, seconds: float, m: int = 512) -> dict:
    """The prefill figure on every ISA the CPU runs, each in its own interpreter."""
    import tempfile
    from pathlib import Path

    from agentkv.bench.isolate import run_isolated

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for isa in ("avx2", "avx512"):
            if K.isa_supported(isa):
                spec = {"isa": isa, "threads": threads, "clock": clock, "seconds": seconds, "rows": m}
                result = run_isolated("agentkv.bench.kernels_peak:worker", spec, Path(tmp), isa, timeout_s=600)
                runs.append(result if "isa" in result else {"isa": isa, **result})
    return {"rows": m, "runs": runs}


def peak_lines(peak: dict) -> list[str]:
    out = [f"\nf32 prefill ({peak['rows']} rows, every layer matmul weighted by its layers) against the FMA peak:"]
    for run in peak["runs"]:
        if "fma_peak_gflops" not in run:
            out.append(f"- {run['isa']}: {run.get('skipped') or run.get('error')}")
            continue
        out.append(
            f"- {run['isa']}: FMA peak {run['fma_peak_gflops']:.1f} GFLOP/s; model matmuls {run['model_gflops']:.1f} "
            f"GFLOP/s = {100 * run['model_of_peak']:.0f}% of it ("
            + ", ".join(f"{r['n']}x{r['k']} q{r['qtype']} {100 * r['of_peak']:.0f}%" for r in run["shapes"])
            + ")"
        )
    return out
