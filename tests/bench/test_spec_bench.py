"""`agentkv bench spec` end to end on tiny settings: the envelope, every arm on both
workloads with the same tokens as plain decode, acceptance figures, a skipped (never passed)
peer when llama_cpp is absent."""

from __future__ import annotations

import json

from agentkv.bench import peers
from agentkv.cli import main


def test_spec_tiny(tmp_path):
    rc = main(["bench", "spec", "--turns", "1", "--max-tokens", "12", "--out", str(tmp_path)])
    assert rc == 0
    payload = json.loads((tmp_path / "spec.json").read_text())
    assert payload["benchmark"] == "spec" and payload["exact"] is True
    assert set(payload["arms"]) == {"off", "ngram", "suffix"}
    for arm in payload["arms"].values():
        assert set(arm) == {"tool-copy", "revise", "open-ended"}
        assert all(0 <= r["predictable"] <= 1 for r in arm.values())
        assert all(r["decode_tokens"] > 0 and r["decode_tok_s"] > 0 for r in arm.values())
    assert payload["arms"]["ngram"]["tool-copy"]["accepted"] > 0
    if peers.missing("llamacpp"):
        assert set(payload["llamacpp"]) == {"skipped"}
