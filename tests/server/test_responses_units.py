"""The Responses API's parts without a model: the LRU store behind previous_response_id, the
request schema's catch-alls, input items to chat messages, and the event stream built from
the shared output reader, validated event by event against the openai client's own types."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agentkv.server.errors import APIError
from agentkv.server.output_parser import OutputParser, OutputSpec, parse_output
from agentkv.server.responses_objects import EventWriter, ResponseObject, usage_of
from agentkv.server.responses_schemas import OtherItem, OtherTool, ResponsesRequest
from agentkv.server.responses_store import ResponseStore, StoredResponse
from agentkv.server.responses_stream import OutputItems
from agentkv.server.responses_translate import input_messages, policy_of
from agentkv.server.tool_policy import tool_policy

EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TEXT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _body(rid: str) -> ResponseObject:
    return ResponseObject(id=rid, status="completed", model="m", parallel_tool_calls=True, tool_choice="auto", tools=[])


def test_store_evicts_least_recently_used():
    store = ResponseStore(capacity=2)
    for rid in ("a", "b"):
        store.put(rid, StoredResponse([], _body(rid)))
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", StoredResponse([], _body("c")))
    assert store.ids() == ["a", "c"] and store.get("b") is None
    with pytest.raises(APIError) as exc:
        store.previous("b")
    assert (exc.value.status, exc.value.code, exc.value.param) == (
        400,
        "previous_response_not_found",
        "previous_response_id",
    )
    with pytest.raises(APIError) as exc:
        store.require("b")
    assert exc.value.status == 404
    assert store.delete("a") and not store.delete("a") and store.ids() == ["c"]
    with pytest.raises(ValueError, match="capacity=0"):
        ResponseStore(capacity=0)


def test_schema_catch_alls_keep_the_type_for_a_400():
    req = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"type": "item_reference", "id": "x"}], "tools": [{"type": "web_search"}]}
    )
    assert isinstance(req.input[0], OtherItem) and req.input[0].type == "item_reference"
    assert isinstance(req.tools[0], OtherTool)
    with pytest.raises(APIError, match="'web_search'") as exc:
        policy_of(req)
    assert exc.value.param == "tools.0.type"
    with pytest.raises(APIError, match="'item_reference'"):
        input_messages(req, [])


def test_items_become_chat_messages():
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Weather in "},
                        {"type": "input_text", "text": "Paris?"},
                    ],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
            ],
        }
    )
    messages = input_messages(req, [])
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[0].content == "Weather in Paris?"
    assert messages[1].content == "Checking." and [c.id for c in messages[1].tool_calls] == ["c1", "c2"]
    assert messages[2].tool_call_id == "c1" and messages[2].content == "18 C"


def test_function_call_output_must_answer_a_call():
    req = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}
    )
    with pytest.raises(APIError, match="nope") as exc:
        input_messages(req, [])
    assert exc.value.param == "input.0.call_id"
    earlier = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"type": "function_call", "call_id": "nope", "name": "f", "arguments": "{}"}]}
    )
    with_history = input_messages(req, input_messages(earlier, []))
    assert with_history[0].role == "tool"  # control: a call made in an earlier turn counts


@pytest.mark.parametrize("step", [1, 3, 11])
def test_stream_events_validate_and_add_up(step):
    spec = OutputSpec(tool_policy([WEATHER], "auto", True))
    write, parser = EventWriter(), OutputParser(spec)
    items = OutputItems(write)
    frames = []
    for i in range(0, len(TEXT), step):
        for ev in parser.feed(TEXT[i : i + step]):
            frames += items.feed(ev)
    for ev in parser.finish():
        frames += items.feed(ev)
    frames += items.finish(incomplete=False)
    events = [EVENTS.validate_python(json.loads(f.split("data: ", 1)[1])) for f in frames]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [f.split("\n", 1)[0] for f in frames] == [f"event: {e.type}" for e in events]
    whole = parse_output(TEXT, spec)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.calls[0].arguments
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["message", "function_call"]
    assert done[0].content[0].text.strip() == whole.content
    assert done[1].arguments == whole.calls[0].arguments and done[1].name == "get_weather"
    body = _body("resp_1")
    body.output, body.usage = items.done, usage_of(10, 4, 3)
    parsed = Response.model_validate(body.model_dump(mode="json"))
    assert parsed.usage.input_tokens_details.cached_tokens == 4 and len(parsed.output) == 2
