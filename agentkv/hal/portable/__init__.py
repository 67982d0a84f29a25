"""The `torch` backend: portable torch ops, no compiled kernels (CPU, and CUDA as `torch-cuda`)."""

from agentkv.hal.portable.backend import F32, TorchBackend, TorchKV, cuda_backend

__all__ = ["F32", "TorchBackend", "TorchKV", "cuda_backend"]
