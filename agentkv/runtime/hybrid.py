"""What the engine does differently for a hybrid model (recurrent layers with state snapshots):
where hits may resume, and the feature that cannot keep its state exact yet."""

from __future__ import annotations

from typing import Any

from agentkv.runtime.config import EngineConfig


class HybridUnsupportedError(ValueError):
    """A feature asked for on a model whose recurrent state it would not keep exact."""


def resume_align(model: Any, block_size: int) -> int:
    """Tokens a prefix hit is cut to a multiple of: a hybrid resumes only from the state
    snapshot at a block end (`cache/snapshots.py`); other models resume at any token."""
    return block_size if model.state_bytes else 1


def check_hybrid(config: EngineConfig, model: Any) -> None:
    """Refuse, naming the flag, what a hybrid model cannot run exactly: the disk tier (its
    files hold K/V only, not the state snapshots). Speculation runs: a verification records
    each row's state (`hal/recurrent.py`)."""
    if not model.state_bytes:
        return
    arch = model.hparams.arch
    if config.cache.disk_dir is not None:
        raise HybridUnsupportedError(
            f"kv_cache_dir={str(config.cache.disk_dir)!r}: the disk tier is not supported on the hybrid model "
            f"{config.model!r} ({arch}): its files do not hold the recurrent-state snapshots"
        )
