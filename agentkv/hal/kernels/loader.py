"""Compiles (once) and loads the AVX2/FMA CPU kernel library, or raises BackendUnavailable
naming why it cannot run here (never a silent stand-in).

The build is cached under ~/.cache/agentkv/kernels/torch<version>-<flags hash>; torch
rebuilds (incrementally, through ninja) when a source changes, and its file lock serialises
concurrent compiles. A stamp per source hash tells whether this exact source was built.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from agentkv.hal.base import BackendUnavailable

log = logging.getLogger(__name__)

NAME = "agentkv_cpu_kernels"
SOURCES = (
    "bindings.cpp",
    "qmatmul.cpp",
    "qmatmul512.cpp",
    "qmatmul_vnni.cpp",
    "qmatmul_int8.cpp",
    "int8_rows.cpp",
    "attention.cpp",
    "attention512.cpp",
    "attention_ranges.cpp",
    "fused.cpp",
    "pool.cpp",
    "layer.cpp",
    "moe.cpp",
    "grouped.cpp",
    "lora.cpp",
    "recurrent.cpp",
    "sparse_mla.cpp",
    "fp16_table.cpp",
)
HEADERS = (
    "simd.h",
    "quant.h",
    "qmatmul.h",
    "qmatmul_impl.h",
    "qmatmul_vnni.h",
    "int8_sweep.h",
    "attention_impl.h",
    "fused.h",
    "pool.h",
    "grouped.h",
    "ops.h",
    "simd512.h",
    "formats512.h",
    "row_groups.h",
    "int8_tiles.h",
    "mxfp4.h",
    "mxfp4_512.h",
    "formats_avx2.h",
    "fp16_table.h",
)
# -ffp-contract=off: no compiler-chosen fusion, so every path runs the same arithmetic.
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-std=c++17")
LDFLAGS = ("-fopenmp",)
COMPILE_SECONDS_HINT = 60
# avx2 or avx512: which build of the matmul kernels to use (default: the best the CPU has).
ISA_ENV = "AGENTKV_CPU_ISA"
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")

_HERE = Path(__file__).resolve().parent
_cached: tuple[ModuleType | None, BackendUnavailable | None] | None = None
_lock = threading.Lock()


def load() -> ModuleType:
    """The compiled kernel module; cached per process, and so is the failure: raises
    BackendUnavailable naming the cause (no C++ compiler, a CPU lacking avx2/fma/f16c, the
    compiler's message of a failed build) on every call.

    The module's functions (tensors contiguous, on the CPU; errors raise RuntimeError):
      qmatmul(x f32 [m, k], w uint8 [n, row_bytes], qtype, n, k) -> f32 [m, n]
      matmul_f32(x f32 [m, k], w f32 [n, k]) -> f32 [m, n]
      dequantize(w uint8 [n, row_bytes], qtype, n, k) -> f32 [n, k]   (== gguf-py, bit for bit)
      interleave_rows(w uint8 [n, row_bytes], qtype, n, k) -> the rows interleaved for the int8 kernels
                      (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4 -> qtype + 2000)
      paged_attention(q f32 [n, h, hd], k_cache, v_cache f32 [num_blocks, block_size, kvh, hd],
                      block_tables int32 [num_seqs, max_blocks], row_seq int32 [n],
                      row_pos int32 [n], scale, window=0, softcap=0.0,
                      sinks f32 [h] | None) -> f32 [n, h, hd]
      rms_norm(x f32 [..., d], w f32 [d], eps, unit_offset) -> f32 [..., d]
      add_norm(h f32 [n, d] (updated in place), delta f32 [n, d], w f32 [d], post_w f32 [d] | None,
               eps, unit_offset) -> normed f32 [n, d]
      glu(x f32 [n, 2f], kind 0 silu | 1 gelu_tanh) -> f32 [n, f]
      attention_inputs(qkv f32 [n, (h + 2 kvh) hd], q_norm, k_norm f32 [hd] | None,
                       cos, sin f32 [num_pos, rope_dim/2], positions, slots int64 [n],
                       k_cache, v_cache f32 [num_slots, kvh, hd] (written), h, kvh, rope_dim,
                       interleaved, eps, unit_offset) -> q f32 [n, h, hd]
      moe_experts(gate, up, down: per-expert weights, qtypes [3], d, f, act, ..., int8) -> MoEExperts, whose
        run(x f32 [n, d], chosen int64 [n, k], probs f32 [n, k]) -> f32 [n, d] (moe.cpp)
      lora_add(x f32 [n, k], y f32 [n, m] (updated in place), row_slot int32 [n], a [f32 [r, k]],
               bt [f32 [r, out]], slot [int], scale [float], col [int]) (lora.cpp)
      sparse_latent_attention(q_abs f32 [n, h, L], q_index f32 [n, H, D], head_w f32 [n, H],
                              store f32|f16 [num_blocks, block_size, 1, L + D], block_tables,
                              row_seq, row_pos, kv_rank, top_k, scale, index_scale)
                              -> f32 [n, h, kv_rank] (sparse_mla.cpp)
    Every output row's bits depend only on that row's inputs (batch-invariant). The ISA
    (isa, set_isa, fix_isa, isa_fixed, isa_supported) is fixed by the first kernel call."""
    global _cached
    with _lock:
        if _cached is None:
            try:
                _cached = (_load_uncached(), None)
            except BackendUnavailable as exc:
                _cached = (None, exc)
    module, failure = _cached
    if failure is not None:
        raise failure
    return module


def unavailable_reason(cpuinfo: str | None = None) -> str | None:
    """Why the kernels cannot be built here, or None if nothing stands in the way. `cpuinfo`
    is /proc/cpuinfo's text (read from the file when None)."""
    flags = _cpu_flags(cpuinfo)
    if flags is not None:
        missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
        if missing:
            return f"CPU lacks {', '.join(missing)}"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH)"
    return None


def _cpu_flags(text: str | None) -> set[str] | None:
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def build_directory() -> Path:
    import torch

    # Keyed by the source folder too: two checkouts (worktrees) never rebuild one .so under
    # each other's running processes.
    key = " ".join(CFLAGS + LDFLAGS) + "|" + str(_HERE)
    flags = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "agentkv" / "kernels" / f"torch{torch.__version__}-{flags}"


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((_HERE / name).read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def build_id() -> str:
    """The kernels' build: a digest of their sources and compile flags (with torch's version)."""
    import torch

    key = "|".join([_source_digest(), " ".join(CFLAGS + LDFLAGS), torch.__version__])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _forget_build(build_dir: Path) -> None:
    """New sources build from nothing: ninja's own staleness check once kept an object file
    (and so a stale .so) after a header changed, which would put old bits behind a new build id."""
    for pattern in ("*.o", "*.so", "build.ninja", ".ninja_deps", ".ninja_log"):
        for path in build_dir.glob(pattern):
            path.unlink(missing_ok=True)


def _build(build_dir: Path, cpp_extension: ModuleType) -> ModuleType:
    """Build (when the sources are new) and load the library. One process at a time per build
    folder: a second one waits, then finds the stamp and only loads."""
    import fcntl

    stamp = build_dir / f"built-{_source_digest()}"
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = not stamp.exists()
        if fresh:
            print(f"compiling agentkv CPU kernels (once, ~{COMPILE_SECONDS_HINT} s)...", file=sys.stderr, flush=True)
            _forget_build(build_dir)
        started = time.perf_counter()
        try:
            module = cpp_extension.load(
                name=NAME,
                sources=[str(_HERE / s) for s in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(build_dir),
                verbose=False,
            )
        except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
            output = getattr(exc, "output", None)  # a failed compiler probe keeps its words here
            detail = f"{exc} {output.decode(errors='replace') if isinstance(output, bytes) else output or ''}"
            raise BackendUnavailable(
                f"backend 'cpu' cannot run here: the kernel build failed: {detail.strip()}"
            ) from exc
        if fresh:
            stamp.touch()
            log.info("compiled agentkv CPU kernels in %.1f s", time.perf_counter() - started)
    return module


def _load_uncached() -> ModuleType:
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"backend 'cpu' cannot run here: {reason}")
    from torch.utils import cpp_extension

    build_dir = build_directory()
    build_dir.mkdir(parents=True, exist_ok=True)
    module = _build(build_dir, cpp_extension)
    isa = os.environ.get(ISA_ENV)
    if isa:
        try:
            module.set_isa(isa)
        except RuntimeError as exc:
            raise ValueError(f"{ISA_ENV}={isa!r}: {exc}") from None
    log.info("agentkv CPU kernels: %s matmuls", module.isa())
    return module
