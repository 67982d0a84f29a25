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
GPT_OSS_PROMPT = [int(t) for t in np.random.default_rng(8).integers(3, 128, 18)]  # past its 16-token window


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


def gpt_oss(folder: Path) -> Path:
    """The tiny random gpt-oss of tests/models (MXFP4 experts as transformers saves them,
    sinks, a 16-token window, biased experts) saved into `folder/gpt-oss`."""
    from tests.models.gpt_oss_tiny import tiny_gpt_oss_mxfp4

    path = folder / "gpt-oss"
    if not path.exists():
        path.mkdir()
        tiny_gpt_oss_mxfp4(path)
    return path


def _runner(path: Path, backend) -> ModelRunner:
    return ModelRunner(load_model(open_model(path), backend), 16, 4)


def _decode_step_reads(path: Path, backend, prompt) -> tuple[np.ndarray, HostReads]:
    """A decode step of the prompt's last token batched after another sequence's chunk."""
    runner, table = _runner(path, backend), list(range(len(prompt) // 4 + 1))
    runner.run([Chunk(prompt[:-1], 0, table, None)])
    other = Chunk(prompt[::-1][:5], 0, [14, 15], "all")
    with HostReads(backend) as reads:
        step = runner.run([other, Chunk(prompt[-1:], len(prompt) - 1, table, "last")])
    return step, reads


def moe_checks(path: Path, be, ref, prompt=PROMPT, control: bool = True) -> dict:
    """Logits against the reference; one chunk == two chunks == a decode row in a batch; the
    host reads of that step, and (`control`) of the same step through the portable dispatch."""
    from agentkv.hal.cuda.backend import CudaBackend
    from agentkv.hal.portable.backend import TorchBackend

    table = list(range(len(prompt) // 4 + 1))
    got = _runner(path, be).run([Chunk(prompt, 0, table, "all")])
    want = _runner(path, ref).run([Chunk(prompt, 0, table, "all")])
    two, cut = _runner(path, be), len(prompt) // 2
    chunked = np.concatenate(
        [two.run([Chunk(prompt[:cut], 0, table, "all")]), two.run([Chunk(prompt[cut:], cut, table, "all")])]
    )
    step, reads = _decode_step_reads(path, be, prompt)

    class PortableMoE(CudaBackend):
        moe_ffn = TorchBackend.moe_ffn
        biased_moe_ffn = None  # hal/biased_moe.py's own grouping (it reads its counts back)

    result = {
        "cosine": cosine(want, got),
        "argmax_equal": bool((want.argmax(-1) == got.argmax(-1)).all()),
        "chunked_equal": bool(np.array_equal(chunked, got)),
        "decode_in_batch_equal": bool(np.array_equal(step[-1], got[-1])),
        "control_rows_differ": not np.array_equal(got[-1], got[-2]),
        "step_host_reads": {"hidden": reads.hidden, "fenced": reads.fenced},
    }
    if control:
        portable = PortableMoE("cpu", interpreter=True, isa="triton-interpreter")
        control_step, control_reads = _decode_step_reads(path, portable, prompt)
        equal = bool(np.array_equal(control_step, step))
        result["control_host_reads"] = {"hidden": control_reads.hidden, "equal": equal}
    return result
