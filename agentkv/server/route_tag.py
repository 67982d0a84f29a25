"""The adapter's place in what a cache-aware router hashes.

SGLang's router (sglang-router 0.3.x) picks a worker by the longest prefix of a request's text
(chat: the messages' contents joined; completions: the prompt) in its per-worker trees; the
request's `model` is not part of it. Two requests of one text for different LoRA adapters (or
an adapter and the base) would therefore share a routing prefix while no worker can share
their KV (each worker keys it by the adapter's content, runtime/adapters.py). The cluster's
front (`commands/cluster_front.py`) puts the adapter into the routed text, and the worker
takes it out again before the prompt is rendered:

    chat:         a first message {"role": "system", "name": "agentkv-route", "content": TAG}
    completions:  the prompt string prefixed with MARK + TAG + MARK

TAG is `agentkv-route ` and 16 hex digits of a SHA-256 over a domain tag and the adapter's
name; a base request carries none. The tag only steers routing: what a worker serves is
keyed by the adapter the `model` field resolves to, so a forged or stale tag can move a
request to another worker, never to another adapter's KV.
"""

from __future__ import annotations

import hashlib
from typing import Any

ROUTE_NAME = "agentkv-route"
MARK = "\x1e"  # ASCII record separator: never in a tokenizer's ordinary text


def route_tag(adapter: str) -> str:
    """The routing tag of adapter `adapter` (its name, without a `base:` prefix)."""
    digest = hashlib.sha256(b"agentkv-route-v1\0" + adapter.encode()).hexdigest()[:16]
    return f"{ROUTE_NAME} {digest}"


def tag_request(body: dict[str, Any], adapter: str) -> dict[str, Any]:
    """`body` (a chat or completions request) with `adapter`'s routing tag in its text."""
    tag = route_tag(adapter)
    if isinstance(body.get("messages"), list):
        return {**body, "messages": [{"role": "system", "name": ROUTE_NAME, "content": tag}, *body["messages"]]}
    if isinstance(body.get("prompt"), str):
        return {**body, "prompt": f"{MARK}{tag}{MARK}{body['prompt']}"}
    return body


def strip_messages(messages: list[Any]) -> list[Any]:
    """Chat messages without a leading routing message (the front's; see the module doc)."""
    if messages and getattr(messages[0], "name", None) == ROUTE_NAME and messages[0].role == "system":
        return messages[1:]
    return messages


def strip_prompt(prompt: Any) -> Any:
    """A completions prompt (a string, a list of strings or token ids) without routing tags."""
    if isinstance(prompt, list):
        return [strip_prompt(p) for p in prompt]
    if isinstance(prompt, str) and prompt.startswith(MARK + ROUTE_NAME):
        end = prompt.find(MARK, 1)
        return prompt[end + 1 :] if end > 0 else prompt
    return prompt
