"""`agentkv witness --backend NAME [--model MODEL] [--kv-cache-dtype f16] [--json]`: op-by-op and
whole-model checks."""

from __future__ import annotations

import importlib
import json
import math

from agentkv.hal.base import ACTIVATION_DTYPES, KV_DTYPES
from agentkv.hal.registry import BackendUnavailable, UnknownBackend, lookup
from agentkv.witness.ops import WitnessRow, run_ops


def add_arguments(p) -> None:
    p.add_argument("--backend", required=True, help="backend to witness (cpu, torch, torch-cuda, cuda, reference)")
    p.add_argument("--model", help="also witness a whole forward of this model")
    p.add_argument("--weights", choices=["resident", "f32"], default="resident")
    p.add_argument(
        "--kv-cache-dtype", choices=KV_DTYPES, default="f32", help="K/V type of the whole-model witness (both sides)"
    )
    p.add_argument(
        "--activation-dtype",
        choices=ACTIVATION_DTYPES,
        default="f32",
        help="matmul activations of the witnessed backend (int8: its own floor); the reference keeps f32",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


# backends whose witness always includes whole models (each a SKIP where it cannot run)
MODEL_ROWS = {"cuda": "agentkv.witness.cuda_ops:model_rows"}


def _model_rows(name: str, backend, reference, cause: str = "") -> list[WitnessRow]:
    if name not in MODEL_ROWS:
        return []
    module_name, attr = MODEL_ROWS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)(backend, reference, cause)


def run(args) -> int:
    reference = lookup("reference")
    try:
        backend = lookup(args.backend).set_activation_dtype(args.activation_dtype)
    except (BackendUnavailable, UnknownBackend, ValueError) as e:
        rows = [WitnessRow("backend", args.backend, math.nan, math.nan, None, math.nan, "SKIP", str(e))]
        rows += _model_rows(args.backend, None, reference, str(e))
    else:
        rows = run_ops(backend, reference)
        if not args.model:
            rows += _model_rows(args.backend, backend, reference)
        else:
            from agentkv.witness.model import witness_model

            dtype = args.kv_cache_dtype
            rows.append(
                witness_model(args.model, backend.set_kv_dtype(dtype), reference.set_kv_dtype(dtype), args.weights)
            )
    ok = all(r.status == "PASS" for r in rows)
    if args.json:
        print(json.dumps({"backend": args.backend, "ok": ok, "rows": [r._asdict() for r in rows]}, default=str))
    else:
        print(_table(rows))
        counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
        print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 0 if ok else 1


def _table(rows: list[WitnessRow]) -> str:
    head = f"{'op':<28} {'shape':<34} {'max|Δ|':>10} {'cosine':>12} {'argmax':>6} {'floor':>12}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        am = "-" if r.argmax_match is None else ("yes" if r.argmax_match else "NO")
        lines.append(
            f"{r.op:<28} {r.shape:<34} {r.max_abs:>10.3g} {r.cosine:>12.9f} {am:>6} "
            f"{r.floor:>12.10g}  {r.status}{'  ' + r.note if r.note else ''}"
        )
    return "\n".join(lines)
