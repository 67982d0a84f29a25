"""The MoE part of tests/hal/cuda_interp.py: a tiny random Qwen3-MoE GGUF (Q8_0 and F16
experts, written by gguf-py's GGUFWriter) on the `cuda` backend under Triton's interpreter.
Its grouped expert dispatch must match the reference, keep a token's bits whatever shares its
batch, and read nothing back from the device; the control runs the portable dispatch, whose
per-expert counts are read back (`.tolist()`), and the count must catch it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agentkv.formats.resolve import open_model
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from agentkv.witness.host_sync import HostReads
from agentkv.witness.ops import cosine

HIDDEN, EXPERT_FFN, VOCAB, EXPERTS, TOP_K, HEADS, HEAD_DIM = 64, 32, 64, 4, 2, 2, 32
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 64, 11)]


def tiny_moe(folder: Path) -> Path:
    """Two layers: Q8_0 experts in layer 0, F16 in layer 1; everything else f32."""
    import gguf

    from agentkv.formats.quants import quantize

    path = folder / "tiny-moe.gguf"
    if path.exists():
        return path
    rng, writer = np.random.default_rng(1), gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in [("context_length", 256), ("embedding_length", HIDDEN), ("block_count", 2),
                       ("feed_forward_length", 4 * HIDDEN), ("attention.head_count", HEADS),
                       ("attention.head_count_kv", 1), ("attention.key_length", HEAD_DIM),
                       ("attention.value_length", HEAD_DIM), ("vocab_size", VOCAB), ("expert_count", EXPERTS),
                       ("expert_used_count", TOP_K), ("expert_feed_forward_length", EXPERT_FFN)]:  # fmt: skip
        writer.add_uint32(f"qwen3moe.{key}", value)
    writer.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(VOCAB)])
    writer.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    f32 = lambda *shape: (rng.standard_normal(shape) / 4).astype(np.float32)  # noqa: E731
    norm = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", f32(VOCAB, HIDDEN))
    for i in range(2):
        for name, shape in [("attn_q", (HEADS * HEAD_DIM, HIDDEN)), ("attn_k", (HEAD_DIM, HIDDEN)),
                            ("attn_v", (HEAD_DIM, HIDDEN)), ("attn_output", (HIDDEN, HEADS * HEAD_DIM)),
                            ("ffn_gate_inp", (EXPERTS, HIDDEN))]:  # fmt: skip
            writer.add_tensor(f"blk.{i}.{name}.weight", f32(*shape))
        for name, n in [
            ("attn_norm", HIDDEN),
            ("ffn_norm", HIDDEN),
            ("attn_q_norm", HEAD_DIM),
            ("attn_k_norm", HEAD_DIM),
        ]:
            writer.add_tensor(f"blk.{i}.{name}.weight", norm(n))
        for name, (rows, cols) in [("ffn_gate_exps", (EXPERT_FFN, HIDDEN)), ("ffn_up_exps", (EXPERT_FFN, HIDDEN)),
                                   ("ffn_down_exps", (HIDDEN, EXPERT_FFN))]:  # fmt: skip
            w = f32(EXPERTS, rows, cols)
            if i == 0:
                data = np.stack([quantize(w[e], 8) for e in range(EXPERTS)])
                writer.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                writer.add_tensor(f"blk.{i}.{name}.weight", w.astype(np.float16))
    writer.add_tensor("output_norm.weight", norm(HIDDEN))
    writer.add_tensor("output.weight", f32(VOCAB, HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _runner(folder: Path, backend) -> ModelRunner:
    return ModelRunner(load_model(open_model(tiny_moe(folder)), backend), 16, 4)


def _decode_step_reads(folder: Path, backend) -> tuple[np.ndarray, HostReads]:
    """A decode step of the prompt's last token batched after another sequence's chunk."""
    runner = _runner(folder, backend)
    runner.run([Chunk(PROMPT[:-1], 0, [0, 1, 2], None)])
    with HostReads(backend) as reads:
        step = runner.run([Chunk(PROMPT[::-1][:5], 0, [8, 9], "all"), Chunk(PROMPT[-1:], 10, [0, 1, 2], "last")])
    return step, reads


def moe_checks(folder: Path, be, ref) -> dict:
    """Logits against the reference; one chunk == two chunks == a decode row in a batch; the
    host reads of that step, and of the same step through the portable dispatch (control)."""
    from agentkv.hal.cuda.backend import CudaBackend
    from agentkv.hal.portable.backend import TorchBackend

    table = [0, 1, 2]
    got = _runner(folder, be).run([Chunk(PROMPT, 0, table, "all")])
    want = _runner(folder, ref).run([Chunk(PROMPT, 0, table, "all")])
    two = _runner(folder, be)
    chunked = np.concatenate(
        [two.run([Chunk(PROMPT[:6], 0, table, "all")]), two.run([Chunk(PROMPT[6:], 6, table, "all")])]
    )
    step, reads = _decode_step_reads(folder, be)

    class PortableMoE(CudaBackend):
        moe_ffn = TorchBackend.moe_ffn

    control = PortableMoE("cpu", interpreter=True, isa="triton-interpreter")
    control_step, control_reads = _decode_step_reads(folder, control)
    return {
        "cosine": cosine(want, got),
        "argmax_equal": bool((want.argmax(-1) == got.argmax(-1)).all()),
        "chunked_equal": bool(np.array_equal(chunked, got)),
        "decode_in_batch_equal": bool(np.array_equal(step[-1], got[-1])),
        "control_rows_differ": not np.array_equal(got[-1], got[-2]),
        "step_host_reads": {"hidden": reads.hidden, "fenced": reads.fenced},
        "control_host_reads": {"hidden": control_reads.hidden, "equal": bool(np.array_equal(control_step, step))},
    }
