"""Compiles the `cuda` backend's kernels for a GPU architecture with Triton's own compiler,
on any machine: no device is needed to lower a kernel to a cubin, so a kernel that the
interpreter runs but the compiler rejects (a non-constexpr global, a bad cast) shows here.

    python -m agentkv.hal.cuda.compile_check [--arch 90] [--all]
"""

from __future__ import annotations

import argparse
import time

from agentkv.hal.cuda import kernels
from agentkv.hal.cuda.dequant import BLOCKS
from agentkv.hal.cuda.launch import DEVICE_TILES

_MATMUL = ("x_ptr", "w_ptr", "b_ptr", "o_ptr", "M", "N", "K", "row_bytes")
_ATTENTION = (
    "q_ptr",
    "k_ptr",
    "v_ptr",
    "o_ptr",
    "tables_ptr",
    "row_seq_ptr",
    "pos_ptr",
    "sinks_ptr",
    "scale",
    "window",
)


def variants(everything: bool) -> list[tuple[str, object, dict, dict]]:
    """(label, kernel, signature, constexprs) of each launch the backend makes (`everything`:
    every weight format; else f32 and one of each block family)."""
    t = DEVICE_TILES
    qtypes = [0, *sorted(BLOCKS)] if everything else [0, 8, 12, 14]
    out = []
    for q in qtypes:
        sig = dict(zip(_MATMUL, ("*fp32", "*fp32" if q == 0 else "*u8", "*fp32", "*fp32", "i32", "i32", "i32", "i32")))
        consts = {"QTYPE": q, "HAS_BIAS": q == 0, "BM": t.bm, "BN": t.bn, "BK": t.bk}
        out.append((f"matmul/qtype={q}", kernels.matmul_kernel, sig, consts))
    grouped = (
        "x_ptr",
        "w_ptr",
        "b_ptr",
        "o_ptr",
        "tile_expert_ptr",
        "tile_row_ptr",
        "row_end_ptr",
        "N",
        "K",
        "row_bytes",
        "E",
    )
    for q in (0, 39):  # f32 experts, and MXFP4 (gpt-oss's)
        ptrs = ("*fp32", "*fp32" if q == 0 else "*u8", "*fp32", "*fp32", "*i64", "*i64", "*i64")
        sig = dict(zip(grouped, (*ptrs, "i32", "i32", "i32", "i32")))
        consts = {"QTYPE": q, "HAS_BIAS": q != 0, "BM": t.bm, "BN": t.bn, "BK": t.bk}
        out.append((f"grouped_matmul/qtype={q}", kernels.grouped_matmul_kernel, sig, consts))
    emb = {"ids_ptr": "*i64", "w_ptr": "*u8", "o_ptr": "*fp32", "K": "i32", "row_bytes": "i32"}
    out.append(("embedding/qtype=8", kernels.embedding_kernel, emb, {"QTYPE": 8, "BK": t.norm}))
    norm = {"x_ptr": "*fp32", "g_ptr": "*fp32", "o_ptr": "*fp32", "D": "i32", "eps": "fp32"}
    out.append(("rms_norm", kernels.rms_norm_kernel, norm, {"UNIT_OFFSET": True, "BD": t.norm}))
    add = {name: "*fp32" for name in ("h_ptr", "d_ptr", "g_ptr", "p_ptr", "hn_ptr", "o_ptr")} | {
        "D": "i32",
        "eps": "fp32",
    }
    out.append(("add_norm/post", kernels.add_norm_kernel, add, {"POST": True, "UNIT_OFFSET": True, "BD": t.norm}))
    for kv, softcap in (("fp32", False), ("fp16", True)):
        sig = dict(
            zip(_ATTENTION, ("*fp32", f"*{kv}", f"*{kv}", "*fp32", "*i32", "*i32", "*i32", "*fp32", "fp32", "i32"))
        )
        sig.update(softcap="fp32", W="i32", BS="i32")
        consts = {"H": 8, "KVH": 2, "HD": 64, "HDP": 64, "BN": t.keys, "SOFTCAP": softcap, "SINKS": not softcap}
        out.append((f"attention/kv={kv}/softcap={softcap}/sinks={not softcap}", kernels.attention_kernel, sig, consts))
    return out


def compile_all(arch: int = 90, everything: bool = False) -> dict[str, int]:
    """label -> cubin bytes for each variant; raises Triton's CompilationError on the first
    kernel that does not compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    sizes = {}
    for label, fn, sig, consts in variants(everything):
        sig = {**sig, **{name: "constexpr" for name in consts}}
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
        sizes[label] = len(compiled.asm["cubin"])
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200), 80 (A100)")
    parser.add_argument("--all", action="store_true", help="every weight format")
    args = parser.parse_args()
    start = time.perf_counter()
    for label, size in compile_all(args.arch, args.all).items():
        print(f"{label:36s} sm_{args.arch} cubin {size} bytes")
    print(f"compiled in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
