"""POST /v1/responses through the official openai client (strict response validation):
text, a function call, a tool loop with function_call_output and previous_response_id,
json_schema output, whole and streamed, cached tokens, the store, and OpenAI's errors."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
INSTRUCTIONS = "You are a weather assistant. Use the tools to answer."
ASK = "What is the weather in Paris?"
CITY = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}},
    "required": ["name", "country"],
    "additionalProperties": False,
}


def _stream(client, **kw):
    events = []
    with client.responses.stream(**kw) as s:
        for ev in s:
            events.append(ev)
    return events


def _call_kw(**kw):
    """A forced single call (parallel calls off: the grammar allows exactly one)."""
    return dict(
        model="smollm2",
        instructions=INSTRUCTIONS,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=48,
        **kw,
    )


def test_text_whole_and_streamed(client):
    kw = dict(model="smollm2", input="Say hello.", temperature=0, max_output_tokens=12)
    whole = client.responses.create(**kw)
    assert [i.type for i in whole.output] == ["message"] and whole.output_text
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 12 and whole.usage.input_tokens > 0
    events = _stream(client, **kw)
    types = [e.type for e in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text  # greedy: the stream says exactly what the whole answer says
    assert events[-1].response.usage.input_tokens_details.cached_tokens > 0  # same prompt again


def test_function_call_whole_and_streamed(client):
    whole = client.responses.create(**_call_kw())
    calls = [i for i in whole.output if i.type == "function_call"]
    assert whole.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    assert [i.type for i in whole.output] == ["function_call"] and whole.parallel_tool_calls is False
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    with client.responses.stream(**_call_kw()) as s:
        deltas = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        final = s.get_final_response()
    streamed = [i for i in final.output if i.type == "function_call"]
    assert len(deltas) > 1 and "".join(deltas) == streamed[0].arguments == calls[0].arguments


def test_tool_loop_with_previous_response_id(client):
    first = client.responses.create(**_call_kw())
    call = next(i for i in first.output if i.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}
    kw = dict(model="smollm2", instructions=INSTRUCTIONS, tools=[WEATHER], temperature=0, max_output_tokens=24)
    second = client.responses.create(previous_response_id=first.id, input=[result], **kw)
    assert [i.type for i in second.output] == ["message"] and second.output_text
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's prefix, reused
    # Control: the same conversation sent whole (stateless) is the same prompt, the same answer.
    items = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        result,
    ]
    stateless = client.responses.create(input=items, **kw)
    assert stateless.output_text == second.output_text
    assert stateless.usage.input_tokens == second.usage.input_tokens
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_store_false_keeps_nothing(client):
    r = client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="smollm2", input="Again", previous_response_id=r.id, max_output_tokens=2)
    assert exc.value.code == "previous_response_not_found"
    assert exc.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    kept = client.responses.create(model="smollm2", input="Hi", max_output_tokens=2)
    assert client.responses.retrieve(kept.id).id == kept.id  # control: stored by default
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_json_schema_output_validates(client):
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    kw = dict(
        model="smollm2", input="Name a city and its country as JSON.", text=fmt, temperature=0, max_output_tokens=64
    )
    r = client.responses.create(**kw)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), CITY)
    with client.responses.stream(**kw) as s:
        final = s.get_final_response()
    assert final.output_text == r.output_text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, "input.0.call_id"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "c"}}}, "text.format.schema"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
    ],
)
def test_errors_in_openai_shape(http, body, param):
    r = http.post("/v1/responses", json={"model": "smollm2", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]},
        {"input": [{"type": ["message"], "role": "user", "content": "x"}]},
        {"input": "x", "tools": [{"type": {"function": 1}, "name": "f"}]},
    ],
)
def test_a_type_that_is_not_a_string_is_a_400(http, body):
    """Found by the schema fuzzer: an object whose `type` was a dict reached the union's
    discriminator, which looked it up in a dict (TypeError, a 500)."""
    r = http.post("/v1/responses", json={"model": "smollm2", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="gpt-x", input="hi")
    assert exc.value.code == "model_not_found"


def test_openapi_documents_responses(http):
    schema = http.get("/openapi.json").json()
    post = schema["paths"]["/v1/responses"]["post"]
    assert "422" not in post["responses"] and "400" in post["responses"]
    props = schema["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert {"input", "instructions", "tools", "tool_choice", "text", "previous_response_id"} <= set(props)
    assert "/v1/responses/{response_id}" in schema["paths"]
