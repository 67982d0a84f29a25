"""The `cpu` backend: torch tensors on the CPU and the compiled kernels of hal/kernels."""

from agentkv.hal.cpu.backend import F32, CpuBackend

__all__ = ["F32", "CpuBackend"]
