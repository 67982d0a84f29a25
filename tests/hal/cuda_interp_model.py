"""The model-level parts of tests/hal/cuda_interp.py: a tiny random llama written by gguf-py's
GGUFWriter, one tensor kind per resident format (F16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K,
Q8_0 embeddings), on the `cuda` backend under Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agentkv.formats.resolve import open_model
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from agentkv.witness.contract import OpWatch
from agentkv.witness.host_sync import HostReads
from agentkv.witness.ops import cosine

BLOCK = 4
PROMPT = [int(t) for t in np.random.default_rng(5).integers(3, 64, 9)]


HIDDEN, FFN, VOCAB, LAYERS = 256, 512, 64, 2
LAYER_QTYPES = {"attn_q": 1, "attn_k": 8, "attn_v": 2, "attn_output": 3, "ffn_gate": 12, "ffn_up": 14, "ffn_down": 13}


def _tensor(rng, shape: tuple[int, int], qtype: int) -> np.ndarray:
    from agentkv.formats.quants import quantize
    from agentkv.witness.ops import random_kquant_blocks

    if qtype in (12, 13, 14):  # gguf-py has no K-quant encoder: random blocks with small scales
        return random_kquant_blocks(qtype, *shape, seed=int(rng.integers(1 << 16)))
    w = (rng.standard_normal(shape) / 8).astype(np.float32)
    return w.astype(np.float16) if qtype == 1 else quantize(w, qtype)


def tiny_llama(folder: Path) -> Path:
    import gguf

    path = folder / "tiny.gguf"
    if path.exists():
        return path
    rng, writer = np.random.default_rng(0), gguf.GGUFWriter(str(path), "llama")
    for key, value in [("context_length", 256), ("embedding_length", HIDDEN), ("block_count", LAYERS),
                       ("feed_forward_length", FFN), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("vocab_size", VOCAB)]:  # fmt: skip
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(VOCAB)])
    writer.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    norm = lambda: (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", _tensor(rng, (VOCAB, HIDDEN), 8), raw_dtype=gguf.GGMLQuantizationType(8))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        for name, qtype in LAYER_QTYPES.items():
            rows = {"ffn_gate": FFN, "ffn_up": FFN, "attn_k": HIDDEN // 2, "attn_v": HIDDEN // 2}.get(name, HIDDEN)
            shape = (HIDDEN, FFN) if name == "ffn_down" else (rows, HIDDEN)
            data = _tensor(rng, shape, qtype)
            writer.add_tensor(
                f"blk.{i}.{name}.weight", data, raw_dtype=None if qtype == 1 else gguf.GGMLQuantizationType(qtype)
            )
    writer.add_tensor("output_norm.weight", norm())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _runner(folder: Path, backend) -> ModelRunner:
    return ModelRunner(load_model(open_model(tiny_llama(folder)), backend), 16, BLOCK)


def model_checks(folder: Path, be, ref) -> dict:
    """Logits of a 9-token prompt against the reference, and the same rows computed in one
    chunk, in two chunks, and as a decode step batched after another sequence's chunk; the
    host reads of that step (the seventh fence) are counted too."""
    table = list(range(3))
    got = _runner(folder, be).run([Chunk(PROMPT, 0, table, "all")])
    want = _runner(folder, ref).run([Chunk(PROMPT, 0, table, "all")])
    two = _runner(folder, be)
    chunked = np.concatenate(
        [two.run([Chunk(PROMPT[:4], 0, table, "all")]), two.run([Chunk(PROMPT[4:], 4, table, "all")])]
    )
    batched = _runner(folder, be)
    batched.run([Chunk(PROMPT[:-1], 0, table, None)])
    other = Chunk(PROMPT[::-1][:3], 0, list(range(8, 9)), "all")
    with HostReads(be) as reads, OpWatch(be, count_calls=False) as watch:
        step = batched.run([other, Chunk(PROMPT[-1:], len(PROMPT) - 1, table, "last")])
    return {
        "cosine": cosine(want, got),
        "argmax_equal": bool((want.argmax(-1) == got.argmax(-1)).all()),
        "chunked_equal": bool(np.array_equal(chunked, got)),
        "decode_in_batch_equal": bool(np.array_equal(step[-1], got[-1])),
        "control_rows_differ": not np.array_equal(got[-1], got[-2]),
        "step_host_reads": {"hidden": reads.hidden, "fenced": reads.fenced},
        "step_off_dtype": watch.off_dtype,
        "step_results": watch.checked,
    }


def fence_control(folder: Path) -> dict:
    """Host reads during a decode step of a backend whose matmul reads a value back (a hidden
    sync, as a data-dependent branch would), which the count must catch at each of its calls
    (the real step is counted in model_checks)."""
    from agentkv.hal.cuda.backend import CudaBackend

    class Leaky(CudaBackend):
        calls = 0

        def matmul(self, x, weight, bias=None):
            if float(x.raw.abs().max()) >= 0:  # a host read: a sync on a device
                Leaky.calls += 1
            return super().matmul(x, weight, bias)

    leaky = Leaky("cpu", interpreter=True, isa="triton-interpreter")
    runner = _runner(folder, leaky)
    runner.run([Chunk(PROMPT[:2], 0, [0], None)])
    Leaky.calls = 0
    with HostReads(leaky) as reads:
        runner.run([Chunk(PROMPT[2:3], 2, [0], "last")])
    return {"hidden": reads.hidden, "fenced": reads.fenced, "leaks": Leaky.calls}
