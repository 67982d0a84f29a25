"""Each family's format end to end over real HTTP: a tiny random llama whose template and
special tokens speak the family's syntax (tests/server/toolformat_models.py) is served, the
server detects the format, and a forced call (required / named) is generated through the
family's own grammar, so it parses -- through the real openai client (chat and Responses)
and the anthropic client, whole and streamed. The next turn's prompt starts with the first
turn's tokens exactly, so the radix cache covers all of it."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import anthropic
import openai
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.server.conftest import serve
from tests.server.toolformat_models import write_family_model

CITY = {"type": "string", "enum": ["Paris", "Oslo"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC"]}},
            "required": ["zone"],
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FAMILIES = [
    *["hermes", "qwen3_coder", "llama3_json", "mistral", "harmony", "glm45", "kimi_k2", "deepseek_v31"],
    *["pythonic", "mistral_v3", "deepseek_v3"],
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    specials = write_family_model(folder, request.param)
    engine = AsyncEngine.from_model(str(folder), max_model_len=1024, kv_cache_blocks=256)
    engine.start()
    for live in serve(create_app(engine, served_model_name="tiny"), engine):
        bias = {str(i): 100 for i in specials.values()}  # markers as special tokens, as a trained model writes them
        yield request.param, live, bias, specials
    asyncio.run(engine.shutdown())


def _chat(family, **kw):
    name, live, bias, _ = family
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        **{"model": "tiny", "temperature": 0, "max_tokens": 120, "logit_bias": bias, "messages": ASK, **kw}
    )


def test_the_format_is_detected(family):
    name, live, _, _ = family
    assert live.app.state.server.output_formats().tool_format == name


def test_named_choice_is_one_call_whole_and_streamed(family):
    named = {"type": "function", "function": {"name": "get_time"}}
    whole = _chat(family, tools=[WEATHER, TIME], tool_choice=named)
    calls = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_time" and json.loads(calls[0].function.arguments) == {"zone": "UTC"}
    streamed: dict[int, dict[str, str]] = {}
    for chunk in _chat(family, tools=[WEATHER, TIME], tool_choice=named, stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = streamed.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
    assert streamed == {0: {"name": "get_time", "arguments": calls[0].function.arguments}}


def test_required_call_and_the_next_turn_hits_the_cache(family):
    first = _chat(family, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY["enum"]
    turn = [*ASK, first.choices[0].message.model_dump(exclude_none=True)]
    turn.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    second = _chat(family, tools=[WEATHER], tool_choice="none", messages=turn, max_tokens=1)
    covered = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= covered - 1  # the last sampled token is not yet in KV


def test_responses_api_required_whole_and_streamed(family):
    _, live, _, _ = family
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", input="Weather in Paris?", tools=[{"type": "function", **WEATHER["function"]}])
    r = client.responses.create(
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=120, temperature=0, **kw
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    events = list(
        client.responses.create(
            tool_choice="required", parallel_tool_calls=False, max_output_tokens=120, temperature=0, stream=True, **kw
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == calls[0].arguments


def test_anthropic_messages_any_whole_and_streamed(family):
    _, live, _, _ = family
    client = anthropic.Anthropic(base_url=live.base_url, api_key="x", max_retries=0)
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    kw = dict(
        model="tiny",
        max_tokens=120,
        extra_body={"temperature": 0},
        messages=ASK,
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    msg = client.messages.create(**kw)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) == 1 and uses[0].input["city"] in CITY["enum"]
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [uses[0].input]


TRIGGER_TOKENS = {  # the special token a call (or its section) opens with; harmony's is text
    "hermes": "<tool_call>",
    "qwen3_coder": "<tool_call>",
    "glm45": "<tool_call>",
    "mistral": "[TOOL_CALLS]",
    "mistral_v3": "[TOOL_CALLS]",
    "llama3_json": "<|python_tag|>",
    "pythonic": "<|python_start|>",
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseek_v3": "<｜tool▁calls▁begin｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜>",
}


def test_a_strict_tool_under_auto_follows_the_grammar_once_begun(family):
    """The model is nudged (logit_bias) to open a call; with `strict` the rest must follow the
    family's grammar, so the call parses; without it this random model writes junk (control).
    Harmony's call opens with text (`<|channel|>commentary to=`), which a bias cannot spell:
    the grammar-level test (test_toolformat_grammar.py) walks it from there."""
    name, _, _, specials = family
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    if name not in TRIGGER_TOKENS:
        r = _chat(family, tools=[strict], tool_choice="auto", max_tokens=4)
        assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
        return
    bias = {str(specials[TRIGGER_TOKENS[name]]): 100}
    r = _chat(family, tools=[strict], tool_choice="auto", parallel_tool_calls=False, logit_bias=bias, max_tokens=90)
    calls = r.choices[0].message.tool_calls or []
    assert len(calls) == 1 and json.loads(calls[0].function.arguments)["city"] in CITY["enum"]
    loose = _chat(
        family, tools=[WEATHER], tool_choice="auto", parallel_tool_calls=False, logit_bias=bias, max_tokens=60
    )
    assert not loose.choices[0].message.tool_calls


def test_responses_honours_strict_under_auto(family):
    """Responses used to drop `strict`. A strict tool whose schema admits nothing cannot be
    held to a grammar: its call's grammar is refused with the API's 400; the same tool without
    `strict` decodes freely (control), so the 400 comes from honouring `strict`."""
    _, live, _, _ = family
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="x", max_retries=0)
    never = {"type": "object", "properties": {"city": {"enum": []}}, "required": ["city"]}
    tool = {"type": "function", "name": "get_weather", "parameters": never}
    kw = dict(model="tiny", input="Weather in Paris?", tool_choice="auto", max_output_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError, match="admits no JSON value"):
        client.responses.create(tools=[{**tool, "strict": True}], **kw)
    assert client.responses.create(tools=[{**tool, "strict": False}], **kw).status in ("completed", "incomplete")


ENDS = {"<|im_end|>", "<|eot_id|>", "</s>", "<|return|>", "<|tool_calls_section_end|>", "<｜tool▁calls▁end｜>"}


def test_parallel_calls_whole_and_streamed(family):
    """`required` with parallel calls: nudged past every place the grammar could end (the
    separator and the next call's marker biased, the end markers not), the model writes the
    most calls the grammar allows; each parses, in order, and the stream gives the same. Ids
    are unique even where the model writes them (Kimi's `functions.NAME:IDX`)."""
    name, live, _, specials = family
    separator = {"llama3_json": ";"}.get(name, "\n")
    stops = live.engine.tokenizer.eos_ids
    bias = {str(i): 100 for t, i in specials.items() if t not in ENDS and i not in stops}
    bias.update({str(i): 100 for i in live.engine.tokenizer.encode(separator, False)})
    kw = dict(tools=[WEATHER, TIME], tool_choice="required", logit_bias=bias, max_tokens=400)
    whole = _chat(family, **kw).choices[0].message.tool_calls
    # MAX_PARALLEL_CALLS; harmony ends the turn at a call's <|call|> (a stop token): one call
    assert len(whole) == (1 if name == "harmony" else 4)
    for call in whole:
        assert json.loads(call.function.arguments) in ({"city": "Paris"}, {"city": "Oslo"}, {"zone": "UTC"})
    streamed: dict[int, list[str]] = {}
    for chunk in _chat(family, stream=True, **kw):
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = streamed.setdefault(d.index, ["", ""])
            entry[0] += d.function.name or ""
            entry[1] += d.function.arguments or ""
    assert [streamed[i] for i in sorted(streamed)] == [[c.function.name, c.function.arguments] for c in whole]
    assert len({c.id for c in whole}) == len(whole)


def test_openai_agents_runs_the_tool_through_the_family_format(family):
    """The openai-agents SDK (Chat Completions model) with turn one forced: the call it gets
    comes from the family's own syntax, and the tool runs with schema-valid arguments."""
    import agents
    from openai import AsyncOpenAI

    _, live, bias, _ = family
    agents.set_tracing_disabled(True)
    ran: list[str] = []

    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=0)
    agent = agents.Agent(
        name="weather",
        tools=[agents.function_tool(get_weather, is_enabled=lambda ctx, agent: not ran)],
        model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        model_settings=agents.ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=60,
            extra_body={"logit_bias": bias},
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=3))
    assert len(ran) == 1 and ran[0] in CITY["enum"]
