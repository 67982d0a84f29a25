"""Everything that can change a KV bit, in one list: the engine fingerprint that salts every
cache outliving a process (the disk tier's chain). Two engines whose parts differ in any
entry may compute different bits for the same tokens, so neither is ever served the other's
blocks. `FINGERPRINT_PARTS` names the entries; `tests/runtime/test_fingerprint.py` walks it,
changing each one and checking that the old files are refused.

    model              SHA-256 of every byte of the model file(s)
    backend, device,   the backend's identity: registry name, device, the compiled kernels'
    isa, kernel_build  ISA and build id (sources digest + compile flags)
    activation_dtype   what the matmuls take (f32, int8)
    kv_dtype           the K/V element type (f32, f16)
    weights            resident quantized blocks or dequantized f32: different matmul paths
    torch, blas        torch's version and the BLAS it dispatches to (the torch and
                       reference backends' GEMMs, and the cpu backend's torch glue)
    numpy              numpy's version and BLAS (the reference backend)
    cpu_isa            the SIMD levels the CPU offers, which MKL / OpenBLAS pick kernels by

The KV layout (block size, layers, heads, head dim) and the file layout version are the disk
tier's own (`cache/disk_fingerprint.py`).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from agentkv.cache.disk_fingerprint import weights_digest

if TYPE_CHECKING:
    from agentkv.runtime.engine import Engine

FINGERPRINT_PARTS = (
    "model",
    "backend",
    "device",
    "isa",
    "kernel_build",
    "activation_dtype",
    "kv_dtype",
    "weights",
    "torch",
    "blas",
    "numpy",
    "cpu_isa",
)
_SIMD = re.compile(r"^(sse\S*|ssse3|avx\S*|fma|f16c|amx\S*)$")


# Environment variables that choose a BLAS's kernels (and so its sums' order).
BLAS_ENV = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@functools.cache
def library_versions() -> dict[str, str]:
    """torch's and numpy's versions and BLAS back-ends, as stable strings (read once)."""
    import numpy as np
    import torch

    torch_blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    deps = np.show_config("dicts").get("Build Dependencies", {})
    numpy_blas = deps.get("blas", {}) if isinstance(deps, dict) else {}
    env = ",".join(f"{k}={os.environ[k]}" for k in BLAS_ENV if k in os.environ)
    return {
        "torch": torch.__version__,
        "blas": f"{torch_blas.group(1) if torch_blas else 'none'};{env}",
        "numpy": f"{np.__version__};{numpy_blas.get('name', '?')} {numpy_blas.get('version', '?')}",
    }


@functools.cache
def cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's SIMD flags, sorted and joined ('' where /proc/cpuinfo cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return " ".join(sorted(f for f in set(flags) if _SIMD.match(f)))


def fingerprint_parts(engine: Engine, cache_dir: Path) -> tuple[tuple[str, str], ...]:
    """(name, value) for each entry of FINGERPRINT_PARTS, in that order. Reads the model's
    bytes unless `cache_dir` already holds their digest for the same path, size and mtime."""
    backend = engine.backend
    name, device, isa, kernel_build = backend.identity
    values = {
        "model": weights_digest(engine.source.path, cache_dir),
        "backend": name,
        "device": device,
        "isa": isa or "",
        "kernel_build": kernel_build or "",
        "activation_dtype": backend.activation_dtype,
        "kv_dtype": backend.kv_dtype,
        "weights": engine.config.weights,
        **library_versions(),
        "cpu_isa": cpu_isa(),
    }
    return tuple((part, str(values[part])) for part in FINGERPRINT_PARTS)
