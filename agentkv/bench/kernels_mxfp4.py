"""`agentkv bench kernels`' MXFP4 rows: the compiled MXFP4 matmul against Q4_0 on gpt-oss-20b's
expert shape (gate_up: 2880 -> 2 x 2880), random codes with sane scales, same run.

m=1 sweeps the gate_up of NUM_EXPERTS experts once per "token" (more bytes than L3 holds, so
weights stream from DRAM, as a decode step's active experts do) and reports GB/s of weight
bytes against the machine's read bandwidth measured in the same run (`stream_gbs`); a larger
m (the command's --m, 512 by default) is one expert's prefill (GFLOP/s)."""

from __future__ import annotations

D, F2 = 2880, 2 * 2880  # gpt-oss-20b: width 2880, expert gate_up rows 2 x 2880
NUM_EXPERTS = 8  # 8 x ~8.8 MB of MXFP4: past L3
MXFP4, Q4_0 = 39, 2
QTYPES = {"MXFP4": MXFP4, "Q4_0": Q4_0}


def expert_weights(qtype: int, seed: int):
    """uint8 [F2, row_bytes] random blocks whose scales stay finite and modest."""
    import numpy as np
    import torch

    from agentkv.hal.kernels import QTYPE_BLOCK, row_bytes

    rng = np.random.default_rng(seed)
    _, size = QTYPE_BLOCK[qtype]
    raw = rng.integers(0, 256, (F2, row_bytes(qtype, D) // size, size), dtype=np.uint8)
    if qtype == MXFP4:
        raw[..., 0] = rng.integers(118, 124, raw.shape[:2])  # E8M0 scale bytes: 2^-10 .. 2^-4
    else:
        raw[..., :2] = (
            rng.uniform(1e-3, 1e-2, raw.shape[:2]).astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
        )
    return torch.from_numpy(raw.reshape(F2, -1))


def stream_gbs(repeats: int = 3) -> dict:
    """Read bandwidth now: the best of `repeats` torch sums over 256 MiB of f32 (8 x L3), on
    the threads torch has (the command's --threads)."""
    import torch

    x = torch.ones(2**26)
    x.sum()
    best = min(_seconds(x.sum) for _ in range(repeats))
    return {"best_gbs": x.numel() * 4 / best / 1e9, "bytes": x.numel() * 4}


def _seconds(fn) -> float:
    import time

    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_mxfp4(K, timer, seconds: float, ms: list[int]) -> dict:
    """Rows per format and m: m=1 sweeps the experts (GB/s, share of the bandwidth), a larger m
    runs one expert (GFLOP/s)."""
    import torch

    bandwidth = stream_gbs()
    rows = []
    for name, qtype in QTYPES.items():
        mats = [expert_weights(qtype, seed) for seed in range(NUM_EXPERTS)]
        nbytes = sum(w.numel() for w in mats)
        for m in ms:
            x = torch.randn(m, D)
            batch = mats if m == 1 else mats[:1]
            t = timer(lambda x=x, batch=batch, qt=qtype: [K.qmatmul(x, w, qt, F2, D) for w in batch], seconds, 2)
            t /= len(batch)
            gbs = nbytes / NUM_EXPERTS / t / 1e9
            rows.append(
                {
                    "format": name,
                    "m": m,
                    "ms_per_expert": 1e3 * t,
                    "gbs": gbs,
                    "of_bandwidth": gbs / bandwidth["best_gbs"],
                    "gflops": 2.0 * m * F2 * D / t / 1e9,
                }
            )
    return {"shape": f"[{F2}, {D}], m=1 over {NUM_EXPERTS} experts", "bandwidth": bandwidth, "rows": rows}


def mxfp4_lines(result: dict) -> list[str]:
    lines = [
        f"- gpt-oss-20b expert gate_up {result['shape']} (bandwidth measured in this run: "
        f"{result['bandwidth']['best_gbs']:.1f} GB/s; contended machine, compare within the run):"
    ]
    q4 = {r["m"]: r for r in result["rows"] if r["format"] == "Q4_0"}
    for r in result["rows"]:
        ratio = r["ms_per_expert"] / q4[r["m"]]["ms_per_expert"]
        parts = [f"{r['ms_per_expert']:.2f} ms/expert"]
        if r["m"] == 1:  # weights stream from DRAM only in the sweep
            parts.append(f"{r['gbs']:.1f} GB/s ({100 * r['of_bandwidth']:.0f}% of bandwidth)")
        parts.append(f"{r['gflops']:.0f} GFLOP/s; time / Q4_0's {ratio:.2f}")
        lines.append(f"  - {r['format']} m={r['m']}: " + ", ".join(parts))
    return lines
