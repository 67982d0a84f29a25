"""`agentkv bench rerank`: one query against N documents on a causal reranker at
Qwen3-Reranker-0.6B's shapes (random Q8_0 weights), with the radix cache on (the shared
instruction + query prefilled once) and off (every pair prefilled whole), in one process.

A prompt is Qwen3-Reranker's layout in token ids: a shared prefix (system prompt, instruction
and query; `--prefix-len`), then the document (`--doc-len`) and the 5-token suffix. Each pair
is one max_tokens=1 engine request reporting its yes/no logits, all admitted at once, as the
server's /v1/rerank does. The scores of both arms must be bit-identical (the exactness
contract); the bench records whether they were. The third arm is llama.cpp's own
`llama-server --reranking` on the same GGUF (rerank_llamacpp.py; skipped without the binary),
whose scores are compared with agentkv's (largest difference, same order)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentkv.bench.common import bar_plot, cache_dir, envelope, log, print_paths, table, write_outputs
from agentkv.bench.moe_model import write_dense_hparams
from agentkv.bench.rerank_gguf import JUDGE_IDS, suffix_ids, text_id_range, write_rank_metadata
from agentkv.bench.rerank_llamacpp import llamacpp_arm
from agentkv.runtime.rerank import judge_score

SUFFIX_LEN = 5  # "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" is 5+ tokens in Qwen3's vocabulary


@dataclass(frozen=True)
class RerankerShape:
    """Qwen3-Reranker-0.6B (= Qwen3-0.6B): tied embeddings, GQA 16/8 heads of 128, q/k norms."""

    layers: int = 28
    d: int = 1024
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 3072
    vocab: int = 151669
    context: int = 4096

    @property
    def tag(self) -> str:
        return f"L{self.layers}-d{self.d}-h{self.heads}x{self.head_dim}-kv{self.kv_heads}-f{self.ffn}-v{self.vocab}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = RerankerShape()
    for name in ("layers", "d", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--docs", type=int, default=100, help="documents ranked against the one query (default 100)")
    parser.add_argument("--prefix-len", type=int, default=64, help="shared prompt tokens: system, instruction, query")
    parser.add_argument("--doc-len", type=int, default=32, help="tokens per document")
    parser.add_argument("--cache-dir", default=None, help="where the synthetic GGUF is kept (default ~/.cache)")
    parser.add_argument("--out", default="bench/out")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the cached build)")


def synthetic_reranker(shape: RerankerShape, seed: int = 0, folder: Path | None = None) -> Path:
    """The random-weight Q8_0 qwen3 GGUF of `shape` (norm gains f32) in llama.cpp's
    Qwen3-Reranker layout (rerank_gguf.py), written once and cached."""
    import gguf

    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"qwen3-reranker-synthetic-{shape.tag}-rank-Q8_0-s{seed}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    try:
        writer = gguf.GGUFWriter(str(partial), "qwen3")
        _metadata(writer, shape)
        rng, q8 = np.random.default_rng(seed), gguf.GGMLQuantizationType.Q8_0
        for name, dims in _tensors(shape):
            data = rng.standard_normal(dims, dtype=np.float32)
            if len(dims) == 1:
                writer.add_tensor(name, np.float32(1.0) + np.float32(0.1) * data)
                continue
            quantized = gguf.quants.quantize(data * np.float32(0.02), q8)
            writer.add_tensor(name, quantized, raw_dtype=q8)
            if name == "token_embd.weight":
                head = quantized[list(JUDGE_IDS)].copy()  # cls.output: the tied head's yes/no rows
        writer.add_tensor("cls.output.weight", head, raw_dtype=q8)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _tensors(shape: RerankerShape):
    d, q, kv = shape.d, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (shape.vocab, d)
    for i in range(shape.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (d,)
        yield b + "attn_q.weight", (q, d)
        yield b + "attn_k.weight", (kv, d)
        yield b + "attn_v.weight", (kv, d)
        yield b + "attn_output.weight", (d, q)
        yield b + "attn_q_norm.weight", (shape.head_dim,)
        yield b + "attn_k_norm.weight", (shape.head_dim,)
        yield b + "ffn_norm.weight", (d,)
        yield b + "ffn_gate.weight", (shape.ffn, d)
        yield b + "ffn_up.weight", (shape.ffn, d)
        yield b + "ffn_down.weight", (d, shape.ffn)
    yield "output_norm.weight", (d,)


def _metadata(writer, shape: RerankerShape) -> None:
    writer.add_name("qwen3-reranker-synthetic")
    write_dense_hparams(writer, shape, 1000000.0)
    write_rank_metadata(writer, shape.vocab, SUFFIX_LEN)
    writer.add_file_type(7)  # MOSTLY_Q8_0


def prompts(vocab: int, docs: int, prefix_len: int, doc_len: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts in the reranker's layout: one shared prefix, a document each, one suffix."""
    rng = np.random.default_rng(seed)
    first, end = text_id_range(vocab)
    draw = lambda n: rng.integers(first, end, n).tolist()  # noqa: E731  (pieces that are one character each)
    prefix, suffix = draw(prefix_len), suffix_ids(vocab, SUFFIX_LEN)
    return [prefix + draw(doc_len) + suffix for _ in range(docs)]


def rank(path: Path, batch: list[list[int]], prefix_cache: bool) -> dict:
    """Judge every prompt at once on a fresh engine; wall time, tokens computed, the logits."""
    from agentkv.runtime.config import CacheConfig, EngineConfig
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams

    blocks = sum(-(-len(p) // 16) + 1 for p in batch) + 8
    engine = Engine(
        EngineConfig(
            model=str(path),
            max_model_len=max(map(len, batch)) + 1,
            cache=CacheConfig(num_blocks=blocks, enable_prefix_cache=prefix_cache),
        )
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logit_token_ids=JUDGE_IDS, speculative=False)
    start = time.perf_counter()
    for i, ids in enumerate(batch):
        engine.add_request(str(i), ids, params)
    logits, cached = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                logits[out.request_id], cached = out.logprobs[0].logits, cached + out.cached_len
    wall = time.perf_counter() - start
    computed = engine.stats().computed_tokens
    rows = np.array([logits[str(i)] for i in range(len(batch))], dtype=np.float32)
    return {"wall_s": wall, "computed_tokens": computed, "cached_tokens": cached, "docs_per_s": len(batch) / wall}, rows


def run(args: argparse.Namespace) -> int:
    shape = RerankerShape(args.layers, args.d, args.heads, args.kv_heads, args.head_dim, args.ffn, args.vocab)
    log(f"synthetic Qwen3-Reranker {shape.tag} Q8_0 ...")
    path = synthetic_reranker(shape, folder=args.cache_dir)
    batch = prompts(shape.vocab, args.docs, args.prefix_len, args.doc_len)
    rank(path, batch[:2], False)  # warm-up: thread pools and first-call kernel set-up, untimed
    load_before = os.getloadavg()
    results, rows = {}, {}
    for arm, on in (("prefix reuse", True), ("no reuse", False)):
        log(f"{arm}: {args.docs} documents ...")
        results[arm], rows[arm] = rank(path, batch, on)
    log(f"llama-server --reranking: {args.docs} documents ...")
    with tempfile.TemporaryDirectory() as work:  # the server's log
        cut = (args.prefix_len, SUFFIX_LEN)
        results["llama.cpp"], theirs = llamacpp_arm(path, batch, cut, Path(work), args.llama_server)
    ours = np.array([judge_score(float(y), float(n)) for y, n in rows["prefix reuse"]])
    payload = envelope(
        "rerank",
        model=str(path),
        shape=asdict(shape),
        docs=args.docs,
        prefix_len=args.prefix_len,
        doc_len=args.doc_len,
        prompt_tokens=sum(map(len, batch)),
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        results=results,
        speedup=results["no reuse"]["wall_s"] / results["prefix reuse"]["wall_s"],
        scores_bit_identical=bool(np.array_equal(rows["prefix reuse"], rows["no reuse"])),
        scores_vs_llamacpp=None if theirs is None else agreement(ours, theirs),
    )
    out = Path(args.out)
    md = markdown(payload)
    groups = {"documents / s": {arm: r["docs_per_s"] for arm, r in results.items() if "docs_per_s" in r}}
    png = bar_plot(
        out / "rerank.png", f"1 query x {args.docs} docs, Qwen3-Reranker-0.6B shapes, Q8_0", groups, "docs/s"
    )
    if png:
        md.append(f"\n![rerank]({png.name})")
    paths = write_outputs(out, "rerank", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0


def markdown(payload: dict) -> list[str]:
    lines = [
        f"model: synthetic Qwen3-Reranker {payload['shape']} Q8_0; 1 query x {payload['docs']} documents "
        f"(shared prefix {payload['prefix_len']} tokens, {payload['doc_len']} per document, "
        f"{payload['prompt_tokens']} prompt tokens in all); load average before "
        f"{payload['load_average_before'][0]:.1f}, after {payload['load_average_after'][0]:.1f}",
        "",
    ]
    rows = [
        [arm, r["wall_s"], r["docs_per_s"], r["computed_tokens"], r["cached_tokens"]]
        for arm, r in payload["results"].items()
        if "wall_s" in r
    ]
    lines += table(["arm", "wall s", "docs/s", "tokens computed", "tokens cached"], rows)
    peer = payload["results"]["llama.cpp"]
    lines += [
        "",
        f"- prefix reuse is ×{payload['speedup']:.2f} faster; scores bit-identical across agentkv's arms: "
        f"{payload['scores_bit_identical']}",
        f"- llama.cpp (llama-server --reranking, same GGUF): {peer if 'wall_s' not in peer else 'ran'}; "
        f"scores against agentkv's: {payload['scores_vs_llamacpp']}",
    ]
    return lines


def agreement(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """How two engines' scores of the same pairs agree: the largest difference, and whether
    they rank the documents the same."""
    return {
        "max_abs_diff": float(np.max(np.abs(ours - theirs))),
        "same_order": bool(np.array_equal(np.argsort(-ours, kind="stable"), np.argsort(-theirs, kind="stable"))),
        "same_top_10": bool(
            np.array_equal(np.argsort(-ours, kind="stable")[:10], np.argsort(-theirs, kind="stable")[:10])
        ),
    }
