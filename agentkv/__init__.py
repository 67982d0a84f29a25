"""agentkv: an LLM inference kernel for agent loops."""

from __future__ import annotations

__version__ = "0.1.0"

# Re-exported lazily, so `import agentkv` (and the torch-free cache/sched layers) stay light.
_EXPORTS = {
    "LLM": "agentkv.runtime.llm",
    "SamplingParams": "agentkv.runtime.params",
    "AsyncEngine": "agentkv.runtime.async_engine",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agentkv' has no attribute {name!r}")
