"""Factories of the `cuda` backend: on a CUDA device (the registry's `cuda`), or on the host
under Triton's interpreter (tests and CI). Triton is imported here, only when one is called."""

from __future__ import annotations

import os

from agentkv.hal.base import BackendUnavailable

INTERPRET_ENV = "TRITON_INTERPRET"  # Triton reads it when it is first imported


def _interpreting() -> bool:
    value = os.environ.get(INTERPRET_ENV, "0").strip().lower()
    if value not in ("", "0", "1", "false", "true"):
        raise BackendUnavailable(f"backend 'cuda': {INTERPRET_ENV}={value!r} is not 0 or 1")
    return value in ("1", "true")


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(f"backend 'cuda' needs Triton (pip install 'agentkv[cuda]'): {e}") from e


def cuda_backend():
    """The `cuda` backend on the current CUDA device, or BackendUnavailable naming why not."""
    import torch

    if not torch.cuda.is_available():
        built = f"torch {torch.__version__} built with CUDA {torch.version.cuda}" if torch.version.cuda else (
            f"torch {torch.__version__} is a CPU-only build"
        )  # fmt: skip
        raise BackendUnavailable(f"backend 'cuda' needs a CUDA device and none is present ({built})")
    if _interpreting():
        raise BackendUnavailable(
            f"backend 'cuda': {INTERPRET_ENV}=1 is set, so Triton would interpret the kernels on the host; "
            "unset it (agentkv.hal.cuda.interpreter_backend is the interpreter's backend)"
        )
    _require_triton()
    from agentkv.hal.cuda.backend import CudaBackend

    major, minor = torch.cuda.get_device_capability()
    return CudaBackend("cuda", interpreter=False, isa=f"sm_{major}{minor}")


def interpreter_backend():
    """The `cuda` backend's kernels run by Triton's interpreter on CPU tensors: the process
    must have set TRITON_INTERPRET=1 before it imported Triton. Not in the registry: no user
    gets the host's interpreter by asking for `cuda`."""
    if not _interpreting():
        raise BackendUnavailable(f"backend 'cuda' interpreter mode needs {INTERPRET_ENV}=1 before Triton is imported")
    _require_triton()
    from agentkv.hal.cuda.backend import CudaBackend

    return CudaBackend("cpu", interpreter=True, isa="triton-interpreter")
