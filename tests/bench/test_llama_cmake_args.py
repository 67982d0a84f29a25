"""bench/llama_cmake_args.sh: llama-cpp-python's build flags follow the CPU's flags, never
native and never AMX (which faults on some Xeons that list it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "llama_cmake_args.sh"


def _args(tmp_path, flags: str) -> dict[str, str]:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    out = subprocess.run(
        ["sh", str(SCRIPT)],
        env={"CPUINFO": str(cpuinfo), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return dict(item.removeprefix("-D").split("=") for item in out)


def test_avx512_cpu_with_amx_listed(tmp_path):
    got = _args(tmp_path, "fpu avx avx2 fma f16c avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16")
    assert got["GGML_NATIVE"] == "OFF"
    assert [got[k] for k in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")] == ["ON"] * 4
    assert [got[k] for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")] == ["OFF"] * 3


def test_avx2_only_cpu_drops_avx512(tmp_path):
    got = _args(tmp_path, "fpu avx avx2 fma f16c")
    assert [got[k] for k in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C")] == ["ON"] * 4
    assert [got[k] for k in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")] == ["OFF"] * 4
