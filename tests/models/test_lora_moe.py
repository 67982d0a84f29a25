"""LoRA on an MoE model's routed experts against PEFT's PeftModel: a tiny random Qwen3-MoE (the
test_moe family) whose fused expert parameters PEFT adapts (`target_parameters`, the nested
ParamWrappers of transformers 5.x's `mlp.experts.gate_up_proj` / `down_proj`), with random
adapters (`init_lora_weights=False`). Cosine >= 0.99999 and equal argmax hold only while both
sides route alike, so the router's top-k margin is asserted on PEFT's model first.

Exactness: a row's bits alone equal its bits batched with rows of another adapter and of the
base (whose bits equal the compiled experts' stack); the control (a LoRA op that sums in a
batch-dependent order) shows the check catches a row that sees how many rows share its expert."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.formats.lora import AdapterError, read_peft_adapter
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.adapters import attach
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import assert_logits_match, prompt, tiny_hf_model
from tests.models.test_lora import peft_adapter, run
from tests.models.test_moe import FAMILIES, MOE, ROUTER_MARGIN, SEEDS, router_margin
from tests.runtime.test_lora_engine import SplitLoraBackend

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ADAPTERS = {
    "attn_experts": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS),
    "down_rslora": dict(r=2, lora_alpha=4, use_rslora=True, target_parameters=["mlp.experts.down_proj"]),
}
MIN_COS = 0.99999


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(base folder, {adapter: (folder, PEFT logits)}, prompt, HF base logits)."""
    root = tmp_path_factory.mktemp("lora_moe")
    spec = {**MOE, **FAMILIES["qwen3moe"]}
    hf = tiny_hf_model(root / "base", spec.pop("model_type"), seed=SEEDS["qwen3moe"], **spec)
    ids = prompt(11, seed=3)
    adapters = {}
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        peft = peft_adapter(root / "base", root / name, seed + 20, **config)
        assert router_margin(peft.base_model.model, ids) > ROUTER_MARGIN  # both sides route alike
        with torch.no_grad():
            adapters[name] = root / name, peft(torch.tensor([ids])).logits[0].float().numpy()
    with torch.no_grad():
        base_logits = hf(torch.tensor([ids])).logits[0].float().numpy()
    return root / "base", adapters, ids, base_logits


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_expert_adapters_match_peft(moe, backend):
    base, adapters, ids, base_logits = moe
    model = load_model(open_model(base), lookup(backend))
    for name, (folder, theirs) in adapters.items():
        ours = run(model, ids, attach(model, read_peft_adapter(folder), name))
        assert_logits_match(ours, theirs, MIN_COS)
        assert np.abs(theirs - base_logits).max() > 0.1  # control: the adapter moves the logits


def test_expert_factors_follow_peft_layout(moe):
    """Expert e's A rows e*r..(e+1)*r and B columns e::E, gate rows before up rows (PEFT's
    get_delta_weight on the 3-D parameter), the only wrapper of down_rslora read as down."""
    _, adapters, _, _ = moe
    modules = read_peft_adapter(adapters["attn_experts"][0]).modules
    kinds = {(m.layer, m.expert, m.kind) for m in modules if m.expert >= 0}
    assert kinds == {(layer, e, k) for layer in (0, 1) for e in range(8) for k in ("gate", "up", "down")}
    down = [m for m in read_peft_adapter(adapters["down_rslora"][0]).modules]
    assert {m.kind for m in down} == {"down"} and down[0].scaling == 4 / np.sqrt(2)


def test_a_row_never_sees_its_neighbours_expert_adapters(moe):
    base, adapters, ids, _ = moe
    model = load_model(open_model(base), lookup("cpu"))
    a = attach(model, read_peft_adapter(adapters["attn_experts"][0]), "a")
    b = attach(model, read_peft_adapter(adapters["down_rslora"][0]), "b")
    other = ids[::-1]
    mixed = ModelRunner(model, 9, 4).run(
        [Chunk(other, 0, [0, 1, 2], "all"), Chunk(ids, 0, [3, 4, 5], "all", a), Chunk(other, 0, [6, 7, 8], "all", b)]
    )
    n = len(ids)
    assert np.array_equal(mixed[n : 2 * n], run(model, ids, a))
    assert np.array_equal(mixed[2 * n :], run(model, other, b))
    assert np.array_equal(mixed[:n], run(model, other))  # the compiled experts' bits
    # control: a LoRA op whose sum order follows the row count breaks the same check
    control = load_model(open_model(base), lookup(SplitLoraBackend.name))
    cb = attach(control, read_peft_adapter(adapters["down_rslora"][0]), "b")
    mixed = ModelRunner(control, 9, 4).run([Chunk(ids, 0, [0, 1, 2], "all"), Chunk(other, 0, [3, 4, 5], "all", cb)])
    assert not np.array_equal(mixed[n:], run(control, other, cb))


def test_an_expert_adapter_for_other_experts_names_the_module_and_both_shapes(moe, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, adapters, _, _ = moe
    folder = adapters["down_rslora"][0]
    (tmp_path / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    save_file(
        {k: v[:, :8] if "lora_A" in k else v for k, v in tensors.items()}, str(tmp_path / "adapter_model.safetensors")
    )
    base, _, _, _ = moe
    model = load_model(open_model(base), lookup("cpu"))
    with pytest.raises(AdapterError) as err:
        attach(model, read_peft_adapter(tmp_path), "bad")
    text = str(err.value)
    assert "adapter_model.safetensors: module 'model.layers.0.mlp.experts.down_proj[0]'" in text
    assert "lora_A [2, 8]" in text and "[64, 32]" in text
