"""Sampling defaults from a model folder's generation_config.json (GGUF ships none)."""

from __future__ import annotations

import json

import pytest

from agentkv.formats.errors import FormatError
from agentkv.formats.generation_config import read_generation_config


def test_reads_the_sampling_keys_only(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "do_sample": True,
                "eos_token_id": [1, 2],
                "repetition_penalty": None,
            }
        )
    )
    assert read_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def test_no_file_or_a_gguf_file_gives_no_defaults(tmp_path):
    assert read_generation_config(tmp_path) == {}
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert read_generation_config(gguf) == {}


@pytest.mark.parametrize(
    "text, needle", [("[1, 2]", "not a JSON object"), ("{", "cannot read"), ('{"top_p": "high"}', "top_p='high'")]
)
def test_bad_file_names_the_problem(tmp_path, text, needle):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(FormatError, match=needle):
        read_generation_config(tmp_path)
