"""The `cuda` backend: Triton kernels, row-invariant by construction (hal/cuda/backend.py)."""

from agentkv.hal.cuda.factory import cuda_backend, interpreter_backend

__all__ = ["cuda_backend", "interpreter_backend"]
