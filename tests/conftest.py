"""Shared fixtures: paths of the packaged real models (installed by `make setup`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentkv.formats.errors import ModelNotFoundError
from agentkv.formats.resolve import resolve_model_path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model_path("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return resolve_model_path("gemma3-270m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return resolve_model_path("minilm")


@pytest.fixture(scope="session", autouse=True)
def _one_gguf_reader_per_packaged_model():
    """gguf-py's GGUFReader parses a vocabulary one numpy view per string: about 30 s for
    Gemma-3's 262,144 tokens on these machines. transformers builds one for a GGUF's config
    and another for its tensors, and several oracles here read the same two packaged files,
    which nothing writes, so the session builds one reader per packaged file and hands it to
    every caller of `gguf.GGUFReader`. Any other file (the ones the tests write) gets a new
    reader each time, as before."""
    import gguf

    packaged = set()
    for alias in ("smollm2", "gemma3-270m"):
        try:
            packaged.add(os.path.realpath(resolve_model_path(alias)))
        except ModelNotFoundError:
            pass  # not installed: the tests that need it say so themselves
    shared: dict[str, gguf.GGUFReader] = {}
    original = gguf.GGUFReader

    class SharedReader(original):
        """gguf.GGUFReader, one instance per packaged file (a class still: agentkv's own
        reader subclasses it, and a subclass is built as before)."""

        def __new__(cls, path, mode="r"):
            key = os.path.realpath(path)
            if cls is SharedReader and mode == "r" and key in packaged:
                if key not in shared:
                    reader = super().__new__(cls)
                    original.__init__(reader, path, mode)  # kept only once it has read the file
                    shared[key] = reader
                return shared[key]
            return super().__new__(cls)

        def __init__(self, path, mode="r"):
            if not any(self is reader for reader in shared.values()):
                super().__init__(path, mode)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", SharedReader)
        yield
