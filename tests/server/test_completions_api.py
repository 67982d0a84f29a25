"""/v1/completions: string, token-id and batched prompts; echo with prompt logprobs."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lenient(smollm2_server):
    """The openai client as users run it (no strict validation): its Logprobs type says floats,
    but it parses the null first-token logprob OpenAI itself sends; strict validation refuses."""
    return openai.OpenAI(base_url=f"{smollm2_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_echo_logprobs_scores_the_prompt(lenient, http, smollm2_engine):
    prompt = "The capital of France is Paris"
    r = lenient.completions.create(model="smollm2", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = r.choices[0]
    ids = smollm2_engine.tokenizer.encode(prompt)
    assert choice.text == prompt
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # no context: no logprob
    raw = http.post(
        "/v1/completions", json={"model": "smollm2", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
    ).json()
    assert raw["choices"][0]["logprobs"]["token_logprobs"][0] is None  # JSON null on the wire
    assert all(x < 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[-1] == len(prompt) - len(lp.tokens[-1])
    assert r.usage.completion_tokens == 0


def test_echo_with_generation(lenient):
    r = lenient.completions.create(
        model="smollm2", prompt="One, two,", max_tokens=3, echo=True, logprobs=2, temperature=0
    )
    choice = r.choices[0]
    assert choice.text.startswith("One, two,") and len(choice.text) > len("One, two,")
    assert len(choice.logprobs.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    assert all(len(t) <= 2 for t in choice.logprobs.top_logprobs[1:])


def test_batched_and_token_prompts(client, smollm2_engine):
    ids = smollm2_engine.tokenizer.encode("Hello")
    r = client.completions.create(model="smollm2", prompt=["Hello", "Goodbye"], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text
    t = client.completions.create(model="smollm2", prompt=ids, max_tokens=3, temperature=0)
    assert t.choices[0].text == r.choices[0].text
    batch = client.completions.create(model="smollm2", prompt=[ids, ids], max_tokens=3, temperature=0)
    assert [c.text for c in batch.choices] == [t.choices[0].text] * 2


def test_stream_matches_non_stream(client, http):
    # Read as raw SSE: intermediate chunks carry finish_reason null, as OpenAI's own do, which
    # the SDK's Completion type (finish_reason required) rejects under strict validation.
    kw = dict(model="smollm2", prompt="Once upon a time", max_tokens=6, temperature=0)
    whole = client.completions.create(**kw)
    with http.stream(
        "POST", "/v1/completions", json={**kw, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole.choices[0].text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == whole.usage.completion_tokens
