"""Agent frameworks pointed at agentkv's OpenAI-compatible base URL: LangChain's ChatOpenAI
(forced tool calls, json_schema structured output) and LiteLLM's OpenAI-compatible provider."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str
    country: str


def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"18 C in {city}"


def _chat(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="unused",
        model="smollm2",
        temperature=0,
        max_tokens=48,
        max_retries=0,
        timeout=300,
    )


def test_langchain_bind_tools_any_returns_tool_calls(smollm2_server):
    llm = _chat(smollm2_server).bind_tools([get_weather], tool_choice="any")
    msg = llm.invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)


def test_langchain_structured_output_json_schema(smollm2_server):
    out = (
        _chat(smollm2_server).with_structured_output(City, method="json_schema").invoke("Name a city and its country.")
    )
    assert isinstance(out, City) and out.name


def test_litellm_tool_call(smollm2_server):
    import litellm

    r = litellm.completion(
        model="openai/smollm2",
        api_base=f"{smollm2_server.base_url}/v1",
        api_key="unused",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        temperature=0,
        max_tokens=48,
        tool_choice="required",
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            }
        ],
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls[0].function.name == "get_weather"
