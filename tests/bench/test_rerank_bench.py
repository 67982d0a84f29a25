"""`agentkv bench rerank` on a tiny shape: the synthetic GGUF loads as a qwen3 model, the reuse
arm computes the shared prefix once (prefix + each document and suffix), the other arm every
prompt token, and the scores of the two arms are bit-identical. Where llama.cpp's server is
built, its `--reranking` arm on the same GGUF reads the prompts' text back into exactly their
ids and ranks the documents as agentkv does."""

from __future__ import annotations

import json

from agentkv.bench.rerank import SUFFIX_LEN
from agentkv.cli import main


def test_bench_rerank_reuses_the_shared_prefix(tmp_path):
    shape = ["--layers", "1", "--d", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--ffn", "64"]
    docs, prefix_len, doc_len = 6, 40, 8
    rc = main(
        ["bench", "rerank", *shape, "--vocab", "400", "--docs", str(docs), "--prefix-len", str(prefix_len)]
        + ["--doc-len", str(doc_len), "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "rerank.json").read_text())
    reuse, cold = payload["results"]["prefix reuse"], payload["results"]["no reuse"]
    assert payload["prompt_tokens"] == docs * (prefix_len + doc_len + SUFFIX_LEN)
    assert reuse["computed_tokens"] == prefix_len + docs * (doc_len + SUFFIX_LEN)
    assert reuse["cached_tokens"] == (docs - 1) * prefix_len
    assert cold["computed_tokens"] == payload["prompt_tokens"] and cold["cached_tokens"] == 0
    assert payload["scores_bit_identical"] is True
    assert (tmp_path / "rerank.md").is_file()
    peer = payload["results"]["llama.cpp"]
    if "skipped" in peer:
        return  # no llama-server binary here (bench/build_llama_server.sh)
    assert peer["prompt_ids_read_back_exactly"] is True and peer["computed_tokens"] == payload["prompt_tokens"]
    agree = payload["scores_vs_llamacpp"]
    assert agree["same_order"] is True and agree["max_abs_diff"] < 1e-2  # 3e-4 seen (Q8_0 both, other kernels)
