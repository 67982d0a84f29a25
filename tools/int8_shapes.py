"""The int8-activation matmul against the f32-activation one on the real models' own weights:
`python tools/int8_shapes.py [--m 1 8 64] [--json PATH]` (run from the checkout with `PYTHONPATH`
pointing at it). One kernel thread, timed by that thread's CPU time (best of 7), so other load
on the machine does not land in the figures; per tensor shape of SmolLM2-135M Q4_1 and
Gemma-3-270M Q4_K_M, the ms per call of each mode and their ratio, and for the formats the
backend interleaves under int8 (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4: `kernels.INTERLEAVED`) the int8 ms of the file's
order, which is what the backend ran before it interleaved them."""

from __future__ import annotations

import argparse
import json
import time

# model -> (tensor, label): one tensor of each shape and format the decode step reads
TENSORS = {
    "smollm2": [
        ("blk.0.attn_q.weight", "attn_q"),
        ("blk.0.attn_k.weight", "attn_k"),
        ("blk.0.ffn_up.weight", "ffn_up"),
        ("blk.0.ffn_down.weight", "ffn_down"),
        ("token_embd.weight", "vocab head"),
    ],
    "gemma3-270m": [
        ("blk.0.attn_q.weight", "attn_q"),
        ("blk.0.attn_v.weight", "attn_v"),
        ("blk.0.attn_output.weight", "attn_output"),
        ("blk.0.ffn_up.weight", "ffn_up"),
        ("blk.0.ffn_down.weight", "ffn_down"),
        ("token_embd.weight", "vocab head"),
    ],
}


def cpu_ms(fn, budget: float = 0.05) -> float:
    fn()
    best = float("inf")
    for _ in range(7):
        reps, t0 = 0, time.thread_time()
        while True:
            fn()
            reps += 1
            spent = time.thread_time() - t0
            if spent >= budget:
                break
        best = min(best, spent / reps)
    return 1e3 * best


def rows(model: str, ms: list[int]) -> list[dict]:
    import gguf
    import numpy as np
    import torch

    from agentkv.formats.resolve import resolve_model_path
    from agentkv.hal.kernels import INTERLEAVED, load

    K = load()
    reader = gguf.GGUFReader(str(resolve_model_path(model)))
    tensors = {t.name: t for t in reader.tensors}
    out = []
    for name, label in TENSORS[model]:
        t = tensors[name]
        k, n = (int(d) for d in t.shape)
        w = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(n, -1))  # a writable copy
        qtype = int(t.tensor_type)
        for m in ms:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            f32 = cpu_ms(lambda x=x, w=w, q=qtype, n=n, k=k: K.qmatmul(x, w, q, n, k))
            int8 = cpu_ms(lambda x=x, w=w, q=qtype, n=n, k=k: K.qmatmul(x, w, q, n, k, int8=True))
            row = dict(model=model, tensor=label, format=t.tensor_type.name, n=n, k=k, m=m, f32_ms=f32, int8_ms=int8)
            line = f"{model} {label} {t.tensor_type.name} {n}x{k} m={m}: f32 {f32:.3f} ms, int8 {int8:.3f} ms"
            if qtype in INTERLEAVED:  # what the backend holds under int8, against the file's order
                wx = K.interleave_rows(w, qtype, n, k)
                row["int8_file_order_ms"], row["int8_ms"] = (
                    int8,
                    cpu_ms(lambda x=x, w=wx, q=INTERLEAVED[qtype], n=n, k=k: K.qmatmul(x, w, q, n, k, int8=True)),
                )
                line = f"{line} in the file's order, {row['int8_ms']:.3f} interleaved"
            out.append(row)
            print(f"{line}, x{f32 / row['int8_ms']:.2f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    out = [r for model in TENSORS for r in rows(model, args.m)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
