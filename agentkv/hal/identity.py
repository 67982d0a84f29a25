"""Backend identity: what a backend's bits depend on, and its fingerprint for cache keys."""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple


class Identity(NamedTuple):
    """What a backend's bits depend on: two backends that differ here may differ in a bit."""

    name: str  # registry name
    device: str
    isa: str | None  # instruction set of compiled kernels; None without any
    kernel_build: str | None  # compiled kernels' build id (sources digest + compile flags)


def fingerprint_of(identity: Identity, activation_dtype: str, kv_dtype: str) -> str:
    """Stable hex digest of an identity and the activation/KV dtypes (same inputs, same digest)."""
    text = json.dumps([*identity, activation_dtype, kv_dtype])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe(identity: Identity) -> str:
    """One line for logs and CLIs: `backend NAME, isa X, kernels BUILD`."""
    return f"backend {identity.name}, isa {identity.isa or 'none'}, kernels {identity.kernel_build or 'none'}"
