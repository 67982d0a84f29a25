"""`agentkv inspect` on the packaged models, checked against gguf-py's own reader."""

from __future__ import annotations

import contextlib
import io
import json
from collections import defaultdict
from pathlib import Path

import gguf
import numpy as np
import pytest

from agentkv.cli import main
from agentkv.formats.resolve import resolve_model_path


def _inspect(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    """`inspect --json` once per packaged model: opening gemma3's 262k-token vocabulary through
    gguf-py costs seconds, so each model is read once by us and once by the oracle."""
    out = {}
    for alias in ("smollm2", "gemma3-270m", "minilm"):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert main(["inspect", alias, "--json"]) == 0
        assert buffer.getvalue().count("\n") == 1  # one JSON object on one line
        out[alias] = json.loads(buffer.getvalue())
    return out


def _oracle(path: Path) -> dict:
    """What inspect must report, computed from gguf-py alone."""
    reader = gguf.GGUFReader(path)
    formats: dict = defaultdict(lambda: {"num_tensors": 0, "num_bytes": 0, "num_params": 0})
    for t in reader.tensors:
        row = formats[t.tensor_type.name]
        row["num_tensors"] += 1
        row["num_bytes"] += int(t.n_bytes)
        row["num_params"] += int(t.n_elements)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    arch = field("general.architecture")
    return {
        "arch": arch,
        "formats": dict(formats),
        "num_params": sum(int(t.n_elements) for t in reader.tensors),
        "num_tensors": len(reader.tensors),
        "num_bytes": sum(int(t.n_bytes) for t in reader.tensors),
        "context_len": field(f"{arch}.context_length"),
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "tokenizer_kind": field("tokenizer.ggml.model"),
        "bos_id": field("tokenizer.ggml.bos_token_id"),
        "has_template": "tokenizer.chat_template" in reader.fields,
    }


@pytest.mark.parametrize("alias", ["smollm2", "gemma3-270m"])
def test_inspect_json_matches_gguf_py(reports, alias: str) -> None:
    report = reports[alias]
    want = _oracle(resolve_model_path(alias))
    for key in ("arch", "num_params", "num_tensors", "num_bytes", "context_len", "vocab_size"):
        assert report[key] == want[key], key
    counts = {name: {k: v for k, v in row.items() if k != "cpu_weights"} for name, row in report["formats"].items()}
    assert counts == want["formats"]
    assert {name: row["cpu_weights"] for name, row in report["formats"].items()}["Q8_0"] == "resident"
    tok = report["tokenizer"]
    assert (tok["kind"], tok["vocab_size"]) == (want["tokenizer_kind"], want["vocab_size"])
    assert tok["special_tokens"]["bos"]["id"] == want["bos_id"]
    assert tok["chat_template"] is want["has_template"]


def test_inspect_smollm2_exact_values(reports) -> None:
    report = reports["smollm2"]
    assert report["formats"]["Q8_0"] == {
        "num_tensors": 1,
        "num_bytes": 30081024,
        "num_params": 49152 * 576,
        "cpu_weights": "resident",
    }
    assert report["tokenizer"]["special_tokens"]["eos"] == {"id": 2, "text": "<|im_end|>"}
    assert report["hparams"]["num_kv_heads"] == 3 and report["hparams"]["tie_embeddings"] is True


def test_inspect_gemma3_layer_pattern(reports) -> None:
    report = reports["gemma3-270m"]
    assert report["sliding_window_layers"] == "SSSSSG" * 3
    assert report["hparams"]["sliding_window"] == 512
    assert report["tokenizer"]["special_tokens"]["bos"] == {"id": 2, "text": "<bos>"}


def test_inspect_minilm_folder(reports) -> None:
    report = reports["minilm"]
    assert (report["kind"], report["arch"], report["vocab_size"]) == ("safetensors", "bert", 30522)
    assert report["formats"]["F32"]["num_tensors"] == 103
    assert report["hparams"]["pooling"] == "mean"
    tok = report["tokenizer"]
    assert (tok["kind"], tok["vocab_size"], tok["chat_template"]) == ("WordPiece", 30522, False)
    assert tok["special_tokens"]["unk"] == {"id": 100, "text": "[UNK]"}


def test_inspect_table(capsys) -> None:
    code, out, _ = _inspect(capsys, "smollm2")
    assert code == 0
    assert "architecture  llama" in out and "context       8192" in out
    assert "Q4_1          210    106,168,320     66,355,200" in out
    assert "chat template yes" in out


def test_inspect_errors_exit_2_with_one_line(capsys, tmp_path: Path) -> None:
    code, out, err = _inspect(capsys, "no-such-model")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "smollm2" in err and "Traceback" not in err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(np.zeros(20, dtype=np.uint8)))
    code, out, err = _inspect(capsys, str(bad), "--json")
    assert (code, out) == (2, "")
    assert "bad.gguf" in err and "wrong magic" in err and err.count("\n") == 1
