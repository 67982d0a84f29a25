"""Chat leftovers over real HTTP: reasoning_content from a `<think>` template (message and
stream deltas), special tokens kept for the tool-call parser, min_tokens, generation-config
defaults (SmolLM2's GGUF ships none)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from agentkv.formats.chat_template import ChatTemplate
from agentkv.server.app import create_app
from agentkv.server.schemas import ChatCompletionRequest
from agentkv.server.translate import sampling_params
from tests.server.conftest import LiveServer, make_client, serve

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]
# SmolLM2's turns, with a generation prompt that opens a <think> block (as DeepSeek-R1's does).
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def think_server(smollm2_engine) -> Iterator[LiveServer]:
    app = create_app(
        smollm2_engine, served_model_name="smollm2", chat_template=ChatTemplate(THINK_TEMPLATE, origin="think-test")
    )
    yield from serve(app, smollm2_engine)


def test_reasoning_content_in_message_and_stream(think_server):
    client = make_client(think_server)
    kw = dict(model="smollm2", messages=HI, max_tokens=12, temperature=0)
    message = client.chat.completions.create(**kw).choices[0].message
    # The raw text of the same prompt: everything before </think> is reasoning.
    ids = httpx.post(f"{think_server.base_url}/tokenize", json={"messages": HI}).json()["tokens"]
    text = client.completions.create(model="smollm2", prompt=ids, max_tokens=12, temperature=0).choices[0].text
    reasoning, _, content = text.partition("</think>")
    assert reasoning and message.model_extra["reasoning_content"] == reasoning
    assert (message.content or "") == content
    stream = client.chat.completions.create(stream=True, **kw)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content
    assert sum(1 for d in deltas if d.model_extra.get("reasoning_content")) > 1


def test_default_template_has_no_reasoning(client):
    r = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8, temperature=0)
    assert r.choices[0].message.model_extra.get("reasoning_content") is None
    assert r.choices[0].message.content


def test_special_tokens_reach_the_tool_parser(client, smollm2_engine):
    im_start = smollm2_engine.tokenizer.token_to_id("<|im_start|>")
    kw = dict(model="smollm2", messages=HI, max_tokens=2, temperature=0, logit_bias={str(im_start): 100})
    with_tools = client.chat.completions.create(tools=[WEATHER], tool_choice="auto", **kw)
    bare = client.chat.completions.create(**kw)
    assert with_tools.choices[0].message.content == "<|im_start|>" * 2
    assert not bare.choices[0].message.content  # control: skipped without tools


def test_min_tokens_holds_off_eos(client):
    kw = dict(model="smollm2", messages=HI, max_tokens=64, temperature=0)
    free = client.chat.completions.create(**kw)
    assert free.choices[0].finish_reason == "stop"  # control: the model ends on EOS early
    num = free.usage.completion_tokens + 6
    held = client.chat.completions.create(extra_body={"min_tokens": num}, **kw)
    assert held.usage.completion_tokens >= num
    assert held.choices[0].message.content.startswith(free.choices[0].message.content)


def test_min_tokens_above_max_tokens_is_a_400(http):
    r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": HI, "max_tokens": 4, "min_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    assert "min_tokens=5" in r.json()["error"]["message"]


def test_generation_config_defaults_apply_unless_the_request_sets_them(smollm2_engine):
    assert smollm2_engine.generation_config == {}  # a GGUF file ships no generation config
    defaults = {"temperature": 0.6, "top_k": 20}
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": HI, "temperature": 0.0})
    params = sampling_params(req, max_tokens=4, logprobs=None, defaults=defaults)
    assert (params.temperature, params.top_k) == (0.0, 20)
    bare = sampling_params(req, max_tokens=4, logprobs=None)
    assert bare.top_k == 0
