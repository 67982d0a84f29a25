"""Shared fixtures: paths of the packaged real models (installed by `make setup`)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
