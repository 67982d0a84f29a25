"""The openai-agents SDK pointed at agentkv: an Agent with a function tool and an output_type,
run to completion with the default Responses model and with the Chat Completions model,
whole and streamed.

SmolLM2-135M, offered the tool and the output schema together under tool_choice auto, calls
the tool on every turn until MaxTurnsExceeded. The run is made deterministic with the SDK's
own knobs, never by touching the model's output: turn one is `tool_choice="required"` with
parallel calls off (exactly one call); the tool is enabled until it has run (`is_enabled`),
and the SDK's `reset_tool_choice` drops the forced choice once a tool was used, so turn two
is decoded under the output schema alone."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

ASK = "What is the weather in Paris?"


class Weather(BaseModel):
    city: str = Field(max_length=16)
    summary: str = Field(max_length=40)


def _run(server, model_class: str, streamed: bool) -> tuple[object, list[str], int]:
    """(the run result, the cities the tool ran for, number of argument-delta events)."""
    import agents
    from agents.stream_events import RawResponsesStreamEvent
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    ran: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C and sunny in {city}"

    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    agent = agents.Agent(
        name="weather",
        instructions="You are a weather assistant. Call get_weather, then answer.",
        tools=[agents.function_tool(get_weather, is_enabled=lambda ctx, agent: not ran)],
        output_type=Weather,
        model=getattr(agents, model_class)(model="smollm2", openai_client=client),
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=96
        ),
    )

    async def run() -> tuple[object, int]:
        if not streamed:
            return await agents.Runner.run(agent, ASK, max_turns=4), 0
        result = agents.Runner.run_streamed(agent, ASK, max_turns=4)
        num_deltas = 0
        async for ev in result.stream_events():
            if isinstance(ev, RawResponsesStreamEvent) and ev.data.type == "response.function_call_arguments.delta":
                num_deltas += 1
        return result, num_deltas

    result, num_deltas = asyncio.run(run())
    return result, ran, num_deltas


def _check(result, ran: list[str]) -> Weather:
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    call = result.new_items[0].raw_item
    assert call.name == "get_weather" and ran and ran[0] in call.arguments  # the tool ran, once
    assert len(ran) == 1
    out = result.final_output
    assert isinstance(out, Weather)
    return Weather.model_validate(out.model_dump())


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_agent_tool_then_output_type(smollm2_server, model_class):
    result, ran, _ = _run(smollm2_server, model_class, streamed=False)
    _check(result, ran)


def test_streamed_runs_emit_argument_deltas_and_agree(smollm2_server):
    answers = []
    for model_class in ("OpenAIResponsesModel", "OpenAIChatCompletionsModel"):
        result, ran, num_deltas = _run(smollm2_server, model_class, streamed=True)
        answers.append(_check(result, ran))
        assert num_deltas > 1, model_class
    # Both APIs render the same prompt and share one generation path: greedy, the same answer.
    assert answers[0] == answers[1]
