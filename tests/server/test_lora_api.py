"""LoRA over HTTP with the official `openai` client: a tiny llama served with two adapters
(`--lora-modules`'s way), requests of both and the base at once, loading and unloading at run
time with vLLM's bodies, SGLang's `base:adapter`, /v1/models cards, errors and metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from agentkv.commands.lora_flags import add_lora_arguments, apply_lora
from agentkv.formats.chat_template import ChatTemplate
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.models.test_lora import peft_adapter
from tests.runtime.test_exactness import byte_level_tokenizer, tiny_hf_model
from tests.server.conftest import make_client, serve

PROMPT = "the quick brown fox"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    import argparse

    root = tmp_path_factory.mktemp("lora_api")
    tiny_hf_model(root / "base", "llama", seed=5, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(root / "base")
    for seed, name in enumerate(("a", "b", "c")):
        peft_adapter(root / "base", root / name, seed + 20, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    tiny_hf_model(root / "wide", "llama", seed=1, hidden_size=96, vocab_size=256)
    peft_adapter(root / "wide", root / "wide_adapter", 0, r=4, lora_alpha=4, target_modules=["o_proj"])
    parser = argparse.ArgumentParser()
    add_lora_arguments(parser)
    args = parser.parse_args(["--lora-modules", f"a={root / 'a'}", "--lora-modules", f"b={root / 'b'}"])
    engine = AsyncEngine.from_model(str(root / "base"), kv_cache_blocks=128)
    apply_lora(engine.engine, args)
    engine.start()
    app = create_app(
        engine, served_model_name="tiny", runtime_lora=True, chat_template=ChatTemplate(TEMPLATE, origin="test")
    )
    for server in serve(app, engine):
        yield server, root


def complete(client: openai.OpenAI, model: str) -> openai.types.Completion:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0.0)


def test_adapters_and_the_base_in_concurrent_requests(lora_server):
    server, _ = lora_server
    client = make_client(server)
    alone = {m: complete(client, m).choices[0].text for m in ("tiny", "a", "b")}
    assert len(set(alone.values())) == 3  # each adapter changes the answer
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda m: (m, complete(client, m)), ["tiny", "a", "b"] * 2))
    for model, out in together:
        assert out.choices[0].text == alone[model]
    again = complete(client, "tiny:a")  # SGLang's base:adapter form
    assert again.choices[0].text == alone["a"] and again.usage.prompt_tokens_details.cached_tokens > 0
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"tiny", "a", "b"}
    assert cards["a"].parent == "tiny" and cards["a"].root.endswith("a")
    assert client.models.retrieve("b").id == "b"


def test_load_and_unload_at_run_time(lora_server):
    server, root = lora_server
    client = make_client(server)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        with pytest.raises(openai.NotFoundError, match="'c'"):
            complete(client, "c")
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(root / "c")})
        assert loaded.status_code == 200, loaded.text
        text = complete(client, "c").choices[0].text
        assert text != complete(client, "tiny").choices[0].text
        again = http.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(root / "c")})
        assert again.status_code == 400 and "load_inplace" in again.json()["error"]["message"]
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "c"}).status_code == 200
        with pytest.raises(openai.NotFoundError):
            complete(client, "c")
        gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        metrics = http.get("/metrics").text
    assert "agentkv_lora_adapters_loaded 2.0" in metrics
    assert 'agentkv_lora_requests_total{adapter="c"} 1.0' in metrics
    assert 'agentkv_lora_tokens_total{adapter="c"}' in metrics


def test_a_bad_adapter_folder_is_a_400_naming_the_file_and_module(lora_server):
    server, root = lora_server
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        wide = http.post("/v1/load_lora_adapter", json={"lora_name": "w", "lora_path": str(root / "wide_adapter")})
        missing = http.post("/v1/load_lora_adapter", json={"lora_name": "m", "lora_path": str(root / "nowhere")})
        assert http.get("/health").status_code == 200
    assert wide.status_code == 400
    message = wide.json()["error"]["message"]
    assert "adapter_model.safetensors" in message and "model.layers.0.self_attn.o_proj" in message
    assert "[64, 64]" in message and "lora_B [96, 4]" in message
    assert missing.status_code == 400 and "adapter_config.json: missing" in missing.json()["error"]["message"]


def test_llama_cpp_per_request_lora_list(lora_server):
    server, _ = lora_server
    client = make_client(server)

    def with_lora(entries):
        return client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=6, temperature=0.0, extra_body={"lora": entries}
        )

    assert (
        with_lora([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]).choices[0].text
        == complete(client, "a").choices[0].text
    )
    assert with_lora([{"id": 0, "scale": 0.0}]).choices[0].text == complete(client, "tiny").choices[0].text
    half = with_lora([{"id": 1, "scale": 0.5}])
    assert half.usage.prompt_tokens_details.cached_tokens == 0  # another scale: another cache key
    with pytest.raises(openai.BadRequestError, match="one per request"):
        with_lora([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}])
    with pytest.raises(openai.BadRequestError, match="id 7 is not an adapter"):
        with_lora([{"id": 7, "scale": 1.0}])


def test_runtime_loading_is_off_unless_enabled(lora_server):
    server, root = lora_server
    for plain in serve(create_app(server.engine, served_model_name="tiny"), server.engine):
        with httpx.Client(base_url=plain.base_url, timeout=60) as http:
            body = {"lora_name": "c", "lora_path": str(root / "c")}
            assert http.post("/v1/load_lora_adapter", json=body).status_code == 404
            assert http.get("/v1/models").json()["data"][1]["parent"] == "tiny"  # adapters still served


def test_every_api_echoes_the_adapter_and_pins_in_its_namespace(lora_server):
    """Chat, completions, Responses and Anthropic Messages name the adapter as requested; an
    Anthropic cache_control pin of an adapter request lands where that request's KV is (the
    adapter's namespace: the pin finds the prefix, `cache_creation_input_tokens` > 0)."""
    import anthropic

    server, _ = lora_server
    client = make_client(server)
    assert complete(client, "tiny:a").model == "tiny:a" and complete(client, "tiny").model == "tiny"
    ask = [{"role": "user", "content": PROMPT}]
    assert client.chat.completions.create(model="b", messages=ask, max_tokens=2).model == "b"
    assert client.responses.create(model="a", input=PROMPT, max_output_tokens=2).model == "a"
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    system = [{"type": "text", "text": "pinned adapter prefix " * 6, "cache_control": {"type": "ephemeral"}}]
    engine = server.engine.engine
    before = engine.cache.num_pins
    pinned = claude.messages.create(model="a", max_tokens=2, system=system, messages=ask)
    assert pinned.model == "a" and engine.cache.num_pins == before + 1
    assert pinned.usage.cache_creation_input_tokens > 0
    with claude.messages.stream(model="b", max_tokens=2, system=system, messages=ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.model == "b" and streamed.usage.cache_creation_input_tokens > 0
