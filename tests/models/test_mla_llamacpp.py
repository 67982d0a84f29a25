"""The tiny DeepSeek-V2, DeepSeek-V3 and GLM-4.5 MoE models of test_mla_families.py converted by
llama.cpp's own `convert_hf_to_gguf.py` (arch `deepseek2` with its attn_k_b / attn_v_b split of
kv_b, and `glm4moe`) to f32, then quantized to Q8_0 and Q4_0 with gguf-py: agentkv's logits
match llama-cpp-python's on the same file within FLOOR, argmax equal where agentkv's top two
are more than NEAR_TIE apart.

The converter runs as tests/models/llamacpp_convert.py runs it (a subprocess with its vendored
gguf-py; the tiny byte-level tokenizer named 'gpt-2' to its tokenizer check).
The floor is not exactness: llama.cpp rounds a quantized matmul's activations to Q8_0 blocks
where agentkv keeps them f32, and sums in another order."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import cosines
from tests.models.llamacpp_convert import convert_all, source_missing
from tests.models.test_mla_families import ROUTER_MARGIN, built_family

REASON = peers.missing("llamacpp")
if REASON:
    pytest.skip(f"llama-cpp-python comparison skipped: {REASON}", allow_module_level=True)
REASON = source_missing()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

# min cosine per position vs llama.cpp on the same file; measured (llama-cpp-python 0.3.36, f16 KV
# both sides): Q8_0 0.99775 (deepseek_v3), 0.99776 (glm4_moe), 0.99930 (deepseek_v2); Q4_0 0.99743
# (glm4_moe), 0.99928 (deepseek_v3), 0.99953 (deepseek_v2). Lower than test_moe_llamacpp's 0.999:
# these tiny models' attention is peakier and llama.cpp rounds every quantized matmul's input
# to Q8_0 (GLM-4.5, with no latent attention, sits at the same level as DeepSeek).
FLOOR = {"Q8_0": 0.997, "Q4_0": 0.997}
# top-2 logit gap (agentkv's) below which the engines may pick differently: measured flips at
# gaps 0.017 (deepseek_v3 Q4_0) and 0.064 (glm4_moe Q8_0); max |logit difference| 0.37
NEAR_TIE = 0.1
CONVERTED = ("deepseek_v2", "deepseek_v3", "glm4_moe")  # V3.2's indexer is not read from a GGUF here
# llama.cpp reads a deepseek2 GGUF without q_lora_rank only at V2-Lite's 27 (or 26) layers, so
# the tiny V2 is compared here in DeepSeek-V2's own shape, with a low-rank q
VARIANTS = {"deepseek_v2": {"q_lora_rank": 24, "seed": 2}}  # seed 2: its routers clear the margin


def convert(folders: list[Path]) -> list[Path]:
    """llama.cpp's converter on each folder -> the f32 GGUFs it writes, in one subprocess."""
    return convert_all([(folder, folder / "model-f32.gguf") for folder in folders])


def requantize(src: Path, dst: Path, qtype: gguf.GGMLQuantizationType) -> Path:
    """A copy of the f32 GGUF `src` whose matrices with whole blocks per row are `qtype`
    (gguf-py's quantizer); routers, norms, biases and the correction bias stay f32."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)])
        router = "ffn_gate_inp" in t.name  # kept f32, as llama.cpp's converter and llama-quantize keep it
        if (
            t.tensor_type == gguf.GGMLQuantizationType.F32
            and data.ndim >= 2
            and data.shape[-1] % 32 == 0
            and not router
        ):
            writer.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, list[int]]]:
    """(model type, qtype) -> (the GGUF, the prompt): each family converted by llama.cpp once
    (f32), then quantized to each type with gguf-py (the converter's own Q8_0 codec)."""
    built = {m: built_family(m, tmp_path_factory, **VARIANTS.get(m, {})) for m in CONVERTED}
    assert all(b[2] > ROUTER_MARGIN for b in built.values())
    f32 = dict(zip(CONVERTED, convert([built[m][0] for m in CONVERTED])))
    return {
        (m, q): (requantize(f32[m], built[m][0] / f"model-{q}.gguf", gguf.GGMLQuantizationType[q]), built[m][3])
        for m in CONVERTED
        for q in FLOOR
    }


def llama_logits(path: Path, ids: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def ours(path: Path, ids: list[int], kv_dtype: str = "f16") -> np.ndarray:
    """agentkv's cpu logits, K/V (the latent rows) stored as f16 like llama.cpp's default cache."""
    model = load_model(open_model(path), lookup("cpu").set_kv_dtype(kv_dtype))
    blocks = math.ceil(len(ids) / 4)
    return ModelRunner(model, blocks, 4).run([Chunk(ids, 0, list(range(blocks)), "all")])


@pytest.mark.parametrize("qtype", sorted(FLOOR))
@pytest.mark.parametrize("model_type", CONVERTED)
def test_gguf_matches_llama_cpp(model_type, qtype, ggufs):
    path, ids = ggufs[model_type, qtype]
    got, want = ours(path, ids), llama_logits(path, ids)
    cos = cosines(got, want)
    assert cos.min() >= FLOOR[qtype], f"{model_type} {qtype}: min cosine {cos.min():.6f} (per row {cos})"
    top2 = np.sort(got, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > NEAR_TIE
    np.testing.assert_array_equal(got[clear].argmax(-1), want[clear].argmax(-1))
