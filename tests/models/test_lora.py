"""LoRA adapters against PEFT's PeftModel (reference, cpu and torch backends): a tiny random
Llama (safetensors, and the same weights as a llama.cpp-style GGUF with its permuted q/k rows)
with random adapters (`init_lora_weights=False`, so B is not zero): plain, rsLoRA with a
rank_pattern and an alpha_pattern on every projection (q/k/v and gate/up land in agentkv's
fused weights), llama.cpp GGUF adapters, and Gemma 3."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentkv.formats.lora import AdapterError, read_adapter, read_peft_adapter
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.adapters import attach
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import BACKENDS, assert_logits_match, prompt, tiny_hf_model, write_gguf

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all": dict(r=4, lora_alpha=6, target_modules=ALL),  # llama.cpp's scaling (alpha / r) can state it
    "rslora_patterns": dict(
        r=8,
        lora_alpha=16,
        use_rslora=True,
        target_modules=ALL,
        rank_pattern={"down_proj": 2, "layers.1.self_attn.k_proj": 3},
        alpha_pattern={"o_proj": 5},
    ),
}
MIN_COS = 0.99999


def peft_adapter(base_folder, folder, seed: int, **config):
    """Save a random PEFT adapter for the model in `base_folder`; returns the PeftModel."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32, attn_implementation="eager")
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **config)).eval()
    with torch.no_grad():  # PEFT's init keeps deltas tiny next to 0.2-scale weights: widen them
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(2.0)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(base folder, GGUF of the same weights, {adapter name: (folder, PEFT logits)}, prompt)."""
    root = tmp_path_factory.mktemp("lora")
    hf = tiny_hf_model(root / "base", "llama", seed=3)
    gguf_path = write_gguf(hf, root / "base.gguf", "llama")
    ids = prompt(12, seed=7)
    adapters = {}
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        model = peft_adapter(root / "base", root / name, seed, **config)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
        adapters[name] = (root / name, logits)
    with torch.no_grad():
        base_logits = hf(torch.tensor([ids])).logits[0].float().numpy()
    return root / "base", gguf_path, adapters, ids, base_logits


def run(model, ids, adapter=None) -> np.ndarray:
    runner = ModelRunner(model, math.ceil(len(ids) / 4), 4)
    return runner.run([Chunk(ids, 0, list(range(runner.num_blocks)), "all", adapter)])


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_adapter_logits_match_peft(tiny, backend, name):
    base, _, adapters, ids, base_logits = tiny
    folder, theirs = adapters[name]
    model = load_model(open_model(base), lookup(backend))
    adapter = attach(model, read_peft_adapter(folder), name)
    ours = run(model, ids, adapter)
    assert_logits_match(ours, theirs, MIN_COS)
    # control: the adapter moves the logits far beyond the tolerance
    assert np.abs(theirs - base_logits).max() > 0.1
    assert not np.allclose(run(model, ids), theirs, atol=1e-2)


def test_adapter_on_a_gguf_base_follows_its_permuted_qk_rows(tiny):
    _, gguf_path, adapters, ids, _ = tiny
    folder, theirs = adapters["rslora_patterns"]
    model = load_model(open_model(gguf_path), lookup("cpu"))
    assert model.config.interleaved
    assert_logits_match(run(model, ids, attach(model, read_peft_adapter(folder), "a")), theirs, MIN_COS)


def test_scaling_follows_rslora_and_the_patterns(tiny):
    _, _, adapters, _, _ = tiny
    modules = {(m.layer, m.kind): m for m in read_peft_adapter(adapters["rslora_patterns"][0]).modules}
    assert modules[(0, "q")].scaling == 16 / math.sqrt(8)
    assert modules[(0, "down")].a.shape[0] == 2 and modules[(0, "down")].scaling == 16 / math.sqrt(2)
    assert modules[(1, "k")].a.shape[0] == 3 and modules[(0, "k")].a.shape[0] == 8
    assert modules[(1, "o")].scaling == 5 / math.sqrt(8)


def test_an_adapter_for_another_model_names_the_module_and_both_shapes(tiny, tmp_path):
    base, _, _, _, _ = tiny
    other = tiny_hf_model(tmp_path / "wide", "llama", seed=1, hidden_size=96)
    del other
    peft_adapter(tmp_path / "wide", tmp_path / "wide_adapter", 0, r=4, lora_alpha=4, target_modules=["v_proj"])
    model = load_model(open_model(base), lookup("reference"))
    with pytest.raises(AdapterError) as err:
        attach(model, read_peft_adapter(tmp_path / "wide_adapter"), "wide")
    text = str(err.value)
    assert "wide_adapter" in text and "model.layers.0.self_attn.v_proj" in text
    assert "lora_A [4, 96]" in text and "[32, 64]" in text


def test_unsupported_modules_and_missing_files_are_named(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(AdapterError, match="adapter_config.json: missing"):
        read_peft_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 2, "lora_alpha": 2}')
    with pytest.raises(AdapterError, match="adapter_model.safetensors: missing"):
        read_peft_adapter(tmp_path)
    stem = "base_model.model.model.layers.0.mlp.experts.3.w1"
    pair = {f"{stem}.lora_A.weight": np.ones((2, 8), np.float32), f"{stem}.lora_B.weight": np.ones((8, 2), np.float32)}
    save_file(pair, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match=r"adapter_model.safetensors: module 'model.layers.0.mlp.experts.3.w1'"):
        read_peft_adapter(tmp_path)


def write_gguf_adapter(folder, path, config, arch: str = "llama"):
    """The PEFT adapter in `folder` as llama.cpp's convert_lora_to_gguf.py writes it: general.type
    adapter, adapter.type lora, adapter.lora.alpha, `blk.N.<proj>.weight.lora_a` [r, in] and
    `.lora_b` [out, r], a llama's q/k B rows permuted as its converter permutes q/k weights."""
    import gguf
    from safetensors.numpy import load_file

    from tests.models.helpers import _llama_permute

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(ADAPTERS["all"]["lora_alpha"]))
    for key, value in sorted(load_file(str(folder / "adapter_model.safetensors")).items()):
        module, part = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if part.startswith("B") and module.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            value = _llama_permute(value, heads)
        writer.add_tensor(f"{name}.lora_{part[0].lower()}", value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("base_kind", ["gguf", "safetensors"])
def test_a_llama_cpp_gguf_adapter_matches_peft(tiny, tmp_path, base_kind):
    from transformers import AutoConfig

    base, gguf_path, adapters, ids, _ = tiny
    folder, theirs = adapters["all"]
    path = write_gguf_adapter(folder, tmp_path / "all.gguf", AutoConfig.from_pretrained(base))
    model = load_model(open_model(gguf_path if base_kind == "gguf" else base), lookup("cpu"))
    assert_logits_match(run(model, ids, attach(model, read_adapter(path), "g")), theirs, MIN_COS)


def test_a_gguf_adapter_for_another_architecture_is_refused(tiny, tmp_path):
    from transformers import AutoConfig

    base, _, adapters, _, _ = tiny
    path = write_gguf_adapter(adapters["all"][0], tmp_path / "q.gguf", AutoConfig.from_pretrained(base), "qwen2")
    model = load_model(open_model(base), lookup("reference"))
    with pytest.raises(AdapterError, match="q.gguf: an adapter for 'qwen2', the base model is 'llama'"):
        attach(model, read_adapter(path), "q")


def test_adapter_on_gemma3_matches_peft(tmp_path_factory):
    """Gemma 3's sandwich norms and local/global layers (its tiny test model), every projection."""
    from tests.models.test_gemma3 import built

    folder, _, base_logits, ids = built("plain", tmp_path_factory)
    out = tmp_path_factory.mktemp("gemma3_lora")
    peft = peft_adapter(folder, out, 4, r=4, lora_alpha=8, use_rslora=True, target_modules=ALL)
    with torch.no_grad():
        theirs = peft(torch.tensor([ids])).logits[0].float().numpy()
    model = load_model(open_model(folder), lookup("cpu"))
    adapter = attach(model, read_adapter(out), "g")
    alone = run(model, ids, adapter)
    assert_logits_match(alone, theirs, MIN_COS)
    assert np.abs(theirs - base_logits).max() > 0.1
    # a row's bits alone and between a base row and a row of another scale (its own key)
    runner = ModelRunner(model, 12, 4)
    other = ids[::-1]
    mixed = runner.run(
        [
            Chunk(other, 0, [0, 1, 2, 3], "all"),
            Chunk(ids, 0, [4, 5, 6, 7], "all", adapter),
            Chunk(other, 0, [8, 9, 10, 11], "all", adapter.scaled(0.5)),
        ]
    )
    assert np.array_equal(mixed[len(other) : len(other) + len(ids)], alone)
    assert np.array_equal(mixed[: len(other)], run(model, other))  # the compiled stack's bits
