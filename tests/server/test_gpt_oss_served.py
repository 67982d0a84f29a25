"""The tiny gpt-oss served with gpt-oss's own chat template (read from llama.cpp's copy of it,
models/templates/openai-gpt-oss-120b.jinja in the vendored source; skipped without it) and a
tokenizer carrying harmony's special tokens: system and developer messages, `reasoning_effort`
(chat) and `reasoning.effort` (Responses) reach the template as its `Reasoning:` line, tools
are laid out as its TypeScript-like namespace, and the openai-agents SDK runs a tool loop on
the Responses model and on chat: turn one forced to a call in harmony, the tool runs, turn two
answers, and its prompt hits the cache over the whole first turn's prefix."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import openai
import pytest

from agentkv.formats.chat_template import ChatTemplate
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.models.gpt_oss_tiny import VOCAB, harmony_tokenizer, tiny_gpt_oss
from tests.models.llamacpp_convert import SRC, source_missing
from tests.server.conftest import serve

TEMPLATE = SRC / "models" / "templates" / "openai-gpt-oss-120b.jinja"
if source_missing() or not TEMPLATE.is_file():
    WHY = source_missing() or "its source has no such file"
    pytest.skip(f"gpt-oss's chat template is not at {TEMPLATE} ({WHY})", allow_module_level=True)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}
ASK = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": "Weather in Paris?"},
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss_served")
    tiny_gpt_oss(folder, vocab_size=VOCAB, seed=5)
    specials = harmony_tokenizer(folder)
    config = {"chat_template": TEMPLATE.read_text(), "eos_token": "<|return|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    engine = AsyncEngine.from_model(str(folder), max_model_len=1024, kv_cache_blocks=256)
    engine.start()
    for live in serve(create_app(engine, served_model_name="tiny"), engine):
        yield live, specials
    asyncio.run(engine.shutdown())


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="x", max_retries=0)


def test_the_format_is_harmony(served):
    live, _ = served
    formats = live.app.state.server.output_formats()
    assert (formats.tool_format, formats.reasoning) == ("harmony", "harmony")


def test_reasoning_effort_reaches_the_template_on_chat_and_responses(served):
    """The prompt is the template's rendering, token for token: `Reasoning: high` is one byte
    token longer than `Reasoning: low` and `medium` three, on chat and on Responses alike."""
    live, _ = served
    client, template = _client(live), ChatTemplate(TEMPLATE.read_text())
    counted = {}
    for effort in ("low", "medium", "high"):
        chat = client.chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER], reasoning_effort=effort, max_tokens=1, temperature=0
        )
        resp = client.responses.create(
            model="tiny",
            input=ASK[2]["content"],
            instructions="Be brief.",
            reasoning={"effort": effort},
            max_output_tokens=1,
            temperature=0,
        )
        counted[effort] = (chat.usage.prompt_tokens, resp.usage.input_tokens)
    assert counted["high"][0] - counted["low"][0] == 1 and counted["medium"][0] - counted["low"][0] == 3
    assert counted["high"][1] - counted["low"][1] == 1 and counted["medium"][1] - counted["low"][1] == 3
    text = template.render(ASK, tools=[WEATHER], reasoning_effort="low")
    assert "Reasoning: low" in text and "# Instructions\n\nBe brief." in text
    assert "namespace functions {\n\n// Current weather for a city.\ntype get_weather = (_: {" in text


def test_tokenize_renders_system_developer_and_tools(served):
    live, _ = served
    import httpx

    body = {"model": "tiny", "messages": ASK, "tools": [WEATHER]}
    ids = httpx.post(live.base_url + "/tokenize", json=body, timeout=30).json()["tokens"]
    text = httpx.post(live.base_url + "/detokenize", json={"model": "tiny", "tokens": ids}, timeout=30).json()["prompt"]
    assert text.startswith("<|start|>system<|message|>") and text.endswith("<|start|>assistant")
    assert "Reasoning: medium" in text  # the template's default effort
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in text
    assert '"Paris" | "Oslo"' in text and "<|start|>user<|message|>Weather in Paris?<|end|>" in text


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_openai_agents_tool_loop_in_harmony(served, model_class):
    """Two turns, each forced (`tool_choice="required"`, kept by `reset_tool_choice=False`): each
    call is generated through harmony's grammar (` to=functions.get_weather<|channel|>commentary
    json<|message|>...<|call|>`, the form the template renders back), parsed back into a call
    and run with schema-valid arguments; turn two's prompt carries turn one's call and the
    tool's result and reuses from the cache all of turn one's prompt and call but the last
    sampled token. The run ends after the second call (a random model never ends a turn by itself)."""
    import agents
    from openai import AsyncOpenAI

    live, _ = served
    agents.set_tracing_disabled(True)
    ran: list[str] = []

    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"sunny in {city}"

    def after_two_calls(ctx, results) -> agents.ToolsToFinalOutputResult:
        return agents.ToolsToFinalOutputResult(is_final_output=len(ran) == 2, final_output=results[-1].output)

    hits_before = live.engine.stats().prefix_hit_tokens
    client = AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=0)
    agent = agents.Agent(
        name="weather",
        instructions="Be brief.",
        tools=[agents.function_tool(get_weather)],
        model=getattr(agents, model_class)(model="tiny", openai_client=client),
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=96
        ),
        reset_tool_choice=False,
        tool_use_behavior=after_two_calls,
    )
    result = asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=3))
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem"] * 2
    assert len(ran) == 2 and set(ran) <= {"Paris", "Oslo"}
    assert result.final_output == f"sunny in {ran[1]}"
    assert live.engine.stats().prefix_hit_tokens - hits_before > 50  # turn two over turn one's prompt
    # (the chat variant runs second and could also hit the Responses run's turn two; the
    # forced-call test below holds the control)
    first, second = (r.usage for r in result.raw_responses[:2])
    assert second.input_tokens_details.cached_tokens >= first.input_tokens + first.output_tokens - 1


ROLE_FORM = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
CHANNEL_FORM = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"


def test_a_forced_call_rendered_back_hits_the_cache_over_its_tokens(served):
    """Turn one is forced to a call; turn two's prompt (the template rendering that call and
    the tool's result) starts with turn one's prompt and generated tokens exactly, so the
    radix cache (token-exact, partial blocks included) covers all of them but the last sampled
    one (`<|call|>`, whose KV is never computed). Control: the same prompt with the call's
    header in the channel form (what the grammar wrote before) hits only turn one's prompt."""
    import httpx

    live, _ = served
    client = _client(live)
    first = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=96
    )
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    turn = [*ASK, first.choices[0].message.model_dump(exclude_none=True)]
    turn.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    second = client.chat.completions.create(model="tiny", messages=turn, tools=[WEATHER], max_tokens=1, temperature=0)
    covered = first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert second.usage.prompt_tokens_details.cached_tokens >= covered

    body = {"model": "tiny", "messages": turn, "tools": [WEATHER]}
    ids = httpx.post(live.base_url + "/tokenize", json=body, timeout=30).json()["tokens"]
    text = httpx.post(live.base_url + "/detokenize", json={"model": "tiny", "tokens": ids}, timeout=30).json()["prompt"]
    assert text.count(ROLE_FORM + call.function.arguments + "<|call|>") == 1  # the arguments as generated
    cached = {}
    for name, prompt in (("same", text), ("channel form", text.replace(ROLE_FORM, CHANNEL_FORM))):
        done = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
        cached[name] = done.usage.prompt_tokens_details.cached_tokens
    assert cached["same"] >= covered  # the completions path tokenizes as chat does
    assert cached["channel form"] == first.usage.prompt_tokens < covered
