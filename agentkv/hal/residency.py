"""Whether a model's weights fit where its backend keeps them, checked before the first
upload: the contract holds every weight resident from load to exit (no streaming, no
offload; the host-shape ledger's "eager full-RAM weights" row), so a model that cannot be
held whole is refused up front, naming both sizes, instead of dying mid-load."""

from __future__ import annotations

import math
import os

from agentkv.hal.base import Backend


class WeightsDoNotFit(ValueError):
    """The weights a backend would hold exceed the memory that holds them."""


def held_bytes(source, backend: Backend, resident: bool) -> int:
    """Bytes the backend holds for `source`'s tensors: a quantized tensor it keeps in its
    blocks counts its file bytes, unless the backend maps the file (`weights == "mapped"`:
    the pages stay the file's) and holds it as it is (`Capabilities.copied_qtypes`: the cpu
    backend's interleaved rows under int8 activations are copies); anything dequantized counts
    4 bytes per element. A 3-D
    tensor is a bank of experts, each held in its blocks as a 2-D weight of its own."""
    caps = backend.capabilities
    total = 0
    for name in source.tensor_names():
        info = source.tensor(name)
        if resident and info.qtype in caps.resident_qtypes and len(info.shape) in (2, 3):
            copied = caps.weights != "mapped" or info.qtype in caps.copied_qtypes
            total += info.data.nbytes if copied else 0
        else:
            total += 4 * math.prod(info.shape)
    return total


def available_bytes(backend: Backend) -> int:
    """Free memory where the backend keeps its weights: the device's, or the host's
    MemAvailable (what the kernel can give without swapping)."""
    if backend.capabilities.weights == "device":
        import torch

        return int(torch.cuda.mem_get_info(torch.device(backend.capabilities.device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_weights_fit(source, backend: Backend, resident: bool, available: int | None = None) -> int:
    """The bytes the backend will hold for `source`; raises WeightsDoNotFit naming the file,
    both sizes and the residency when they exceed `available` (default: measured now)."""
    needed = held_bytes(source, backend, resident)
    free = available_bytes(backend) if available is None else available
    if needed > free:
        caps = backend.capabilities
        raise WeightsDoNotFit(
            f"{source.path}: backend {backend.name!r} would hold {needed / 2**30:.2f} GiB of weights "
            f"({caps.weights} on {caps.device}) but {free / 2**30:.2f} GiB is available; every weight stays "
            "resident from load to exit (no streaming or offload): use a smaller quant type, resident weights, "
            "or a machine with more memory"
        )
    return needed
