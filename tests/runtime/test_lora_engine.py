"""LoRA in the engine: exactness across adapter mixes, and a cache keyed by what an adapter is.

- A request's logits are bit-identical alone and batched with requests of two other adapters
  and the base, with the prefix cache off and on (a warm hit), and after a restart from the
  disk tier. The control (a LoRA op that sums in a batch-dependent order) shows the batched
  check catches a row that sees its neighbours.
- A reload under the same name with other weights: `cached_tokens == 0` and the new
  adapter's logits; two names for the same weights share hits; the base never hits an
  adapter's KV."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.cpu import CpuBackend
from agentkv.hal.registry import register
from agentkv.runtime.adapters import request_namespace
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.engine_state import configure_lora
from agentkv.runtime.params import SamplingParams
from tests.models.test_lora import peft_adapter
from tests.runtime.test_exactness import byte_level_tokenizer, tiny_hf_model, tokens

GREEDY = SamplingParams(max_tokens=3, temperature=0.0)
QKV_MLP = ["q_proj", "k_proj", "v_proj", "down_proj"]


class SplitLoraBackend(CpuBackend):
    """The control: its LoRA op splits the shrink's sum into `rows % 4 + 1` slices summed in
    turn (as a library choosing a split by shape would), so a row's bits depend on the batch."""

    name = "cpu-split-lora"

    def lora_add(self, x, y, row_slots, pieces):
        xs, ys = x.raw.numpy(), y.raw.numpy()
        bounds = np.linspace(0, xs.shape[1], xs.shape[0] % 4 + 2).astype(int)
        for i in np.flatnonzero(row_slots >= 0):
            for p in (p for p in pieces if p.slot == row_slots[i]):
                a, bt = p.a.raw.numpy(), p.bt.raw.numpy()
                t = sum(a[:, lo:hi] @ xs[i, lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:]))
                ys[i, p.col : p.col + bt.shape[1]] += np.float32(p.scale) * (t @ bt)
        return y


register(SplitLoraBackend.name, SplitLoraBackend, "approx")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny llama with a tokenizer, and adapters a, b, c (different weights) and a2 (a's
    config, other weights)."""
    root = tmp_path_factory.mktemp("lora_engine")
    tiny_hf_model(root / "base", "llama", seed=5, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(root / "base")
    for seed, name in enumerate(("a", "b", "c", "a2")):
        targets = ["q_proj", "v_proj", "gate_proj", "up_proj"] if name == "b" else QKV_MLP
        peft_adapter(root / "base", root / name, seed + 10, r=4, lora_alpha=8, target_modules=targets)
    return root


def make_engine(root, backend="cpu", prefix_cache=True, disk_dir=None) -> Engine:
    cache = CacheConfig(num_blocks=64, block_size=4, enable_prefix_cache=prefix_cache, dtype="f32", disk_dir=disk_dir)
    engine = Engine(EngineConfig(model=str(root / "base"), backend=backend, cache=cache))
    engine.record_logits = True
    for name in ("a", "b", "c"):
        engine.adapters.load(name, str(root / name))
    return engine


def run(engine: Engine, requests: dict[str, tuple[list[int], str | None]]):
    """Submit all at once, step to completion: rid -> (sampled logits rows, cached_len)."""
    for rid, (ids, name) in requests.items():
        adapter = engine.adapters.get(name) if name else None
        engine.add_request(rid, ids, GREEDY, namespace=request_namespace(adapter=adapter))
    cached = {}
    while engine.has_unfinished():
        for out in engine.step():
            cached[out.request_id] = out.cached_len
    engine.scheduler.check_integrity()
    return {rid: (engine.recorded.pop(rid), cached[rid]) for rid in requests}


def same(x, y) -> bool:
    return len(x) == len(y) and all(np.array_equal(a, b) for a, b in zip(x, y))


PROMPT = tokens(21, 1, 256)
MIX = {"b": (tokens(17, 2, 256), "b"), "c": (tokens(9, 3, 256), "c"), "base": (tokens(13, 4, 256), None)}


def alone_and_batched(engine: Engine):
    alone = run(engine, {"x": (PROMPT, "a")})["x"][0]
    base_alone = run(engine, {"y": (MIX["base"][0], None)})["y"][0]
    batched = run(engine, {"x": (PROMPT, "a"), **MIX})
    return alone, batched["x"][0], base_alone, batched["base"][0], batched["x"][1]


def test_a_row_never_sees_its_neighbours_adapters(model_dir):
    off = make_engine(model_dir, prefix_cache=False)
    alone, batched, base_alone, base_batched, _ = alone_and_batched(off)
    assert same(alone, batched) and same(base_alone, base_batched)
    on = make_engine(model_dir, prefix_cache=True)
    alone_on, batched_on, _, _, cached = alone_and_batched(on)
    assert cached > 0  # the batched run's prefix came from the cache
    assert same(alone_on, alone) and same(batched_on, alone)
    plain = run(on, {"z": (PROMPT, None)})["z"]
    assert plain[1] == 0 and not np.array_equal(plain[0][0], alone[0])  # the base never hits a's KV


def test_the_control_shows_the_batched_check_can_fail(model_dir):
    control = make_engine(model_dir, backend=SplitLoraBackend.name, prefix_cache=False)
    alone, batched, _, _, _ = alone_and_batched(control)
    assert not same(alone, batched)


def test_a_reload_under_the_same_name_never_meets_the_old_kv(model_dir):
    engine = make_engine(model_dir)
    first = run(engine, {"1": (PROMPT, "a")})["1"]
    again = run(engine, {"2": (PROMPT, "a")})["2"]
    assert again[1] > 0 and same(again[0], first[0])
    engine.adapters.load("a", str(model_dir / "a2"))
    reloaded = run(engine, {"3": (PROMPT, "a")})["3"]
    assert reloaded[1] == 0 and not np.array_equal(reloaded[0][0], first[0][0])
    fresh = make_engine(model_dir, prefix_cache=False)
    fresh.adapters.load("new", str(model_dir / "a2"))
    assert same(run(fresh, {"4": (PROMPT, "new")})["4"][0], reloaded[0])


def test_two_names_for_the_same_weights_share_hits(model_dir):
    engine = make_engine(model_dir)
    engine.adapters.load("a-copy", str(model_dir / "a"))
    first = run(engine, {"1": (PROMPT, "a")})["1"]
    copy = run(engine, {"2": (PROMPT, "a-copy")})["2"]
    assert copy[1] > 0 and same(copy[0], first[0])
    engine.adapters.load("a-louder", str(model_dir / "a"), scale=2.0)  # another scale: another key
    assert run(engine, {"3": (PROMPT, "a-louder")})["3"][1] == 0


def test_a_restart_from_the_disk_tier_gives_the_same_bits(model_dir, tmp_path):
    first = make_engine(model_dir, disk_dir=str(tmp_path))
    cold = run(first, {"1": (PROMPT, "a")})["1"]
    first.close()
    second = make_engine(model_dir, disk_dir=str(tmp_path))
    assert run(second, {"b": (PROMPT, "b")})["b"][1] == 0  # b's namespace holds none of a's blocks
    warm = run(second, {"2": (PROMPT, "a")})["2"]
    assert warm[1] >= 16 and same(warm[0], cold[0])
    assert second.stats().disk.hit_blocks > 0


def test_max_loras_cuts_the_step_without_changing_a_bit(model_dir):
    engine = make_engine(model_dir, prefix_cache=False)
    configure_lora(engine, max_loras=1, max_cpu_loras=2)
    alone, batched, base_alone, base_batched, _ = alone_and_batched(engine)
    assert same(alone, batched) and same(base_alone, base_batched)
    assert engine.adapters.num_loaded() == 2  # the LRU dropped one and reloaded on use
    with pytest.raises(ValueError, match="max_loras=0"):
        configure_lora(engine, max_loras=0)


def test_f16_adapters_keep_the_contract_under_their_own_key(model_dir):
    engine = make_engine(model_dir, prefix_cache=True)
    f32 = run(engine, {"1": (PROMPT, "a")})["1"]
    configure_lora(engine, dtype="f16")
    engine.adapters.load("a16", str(model_dir / "a"))
    assert engine.adapters.get("a16").key != engine.adapters.get("a").key
    alone = run(engine, {"2": (PROMPT, "a16")})["2"]
    assert alone[1] == 0 and not same(alone[0], f32[0])  # rounded adapter: never a's KV
    batched = run(engine, {"3": (PROMPT, "a16"), **MIX})["3"]
    assert batched[1] > 0 and same(batched[0], alone[0])
    with pytest.raises(ValueError, match="lora_dtype='f16' is not supported by backend 'reference'"):
        configure_lora(make_engine(model_dir, backend="reference"), dtype="f16")


def test_unloading_an_adapter_lets_its_running_requests_finish(model_dir):
    engine = make_engine(model_dir, prefix_cache=False)
    whole = run(engine, {"1": (PROMPT, "a")})["1"][0]
    engine.add_request("2", PROMPT, GREEDY, namespace=request_namespace(adapter=engine.adapters.get("a")))
    engine.step()
    engine.adapters.unload("a")
    with pytest.raises(KeyError, match="'a' is not loaded"):
        engine.adapters.get("a")
    while engine.has_unfinished():
        engine.step()
    assert same(engine.recorded.pop("2"), whole)
