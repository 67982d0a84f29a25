"""`LLM`: the offline entry point — load a model, generate for a list of prompts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from agentkv.runtime.config import EngineConfig, engine_config
from agentkv.runtime.engine import Engine
from agentkv.runtime.outputs import RequestOutput
from agentkv.runtime.params import SamplingParams


class LLM:
    """Synchronous generation on the batching engine.

    `LLM("smollm2", backend="cpu").generate(["Hello"], SamplingParams(max_tokens=8))`, or
    `LLM(EngineConfig(...))`; keyword overrides are the flat knob names of
    `agentkv.runtime.config.KNOBS` (block_size, kv_cache_blocks, max_num_seqs, ...) or whole
    `cache=` / `scheduler=` sections, built into one EngineConfig (`self.config`)."""

    def __init__(self, model: str | EngineConfig, **overrides: Any):
        self.config = engine_config(model, **overrides)
        self.engine = Engine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self, prompts: str | Sequence[str] | Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run every prompt to completion (batched); results in prompt order.

        Prompts are strings (tokenized with the model's own rules) or lists of token ids.
        Raises the engine's ValueError subclasses for a prompt it refuses (then none of this
        call's prompts stays queued); a prompt that fails while running comes back finished
        with finish_reason "error" and its `error`. Only this call's outputs are collected."""
        params = params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        order: list[str] = []
        try:
            for prompt in prompts:
                ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
                rid = f"llm-{next(self._ids)}"
                self.engine.add_request(rid, ids, params)
                order.append(rid)
        except BaseException:
            for rid in order:  # the ones queued before the refused prompt
                self.engine.abort(rid)
            raise
        return self._drain(order)

    def chat(self, messages: list[dict], params: SamplingParams | None = None, **template_kw) -> RequestOutput:
        """One chat turn through the model's chat template."""
        if self.engine.chat_template is None:
            from agentkv.formats.errors import ChatTemplateError

            raise ChatTemplateError(f"{self.engine.source.path}: the model has no chat template")
        prompt = self.engine.chat_template.render(messages, add_generation_prompt=True, **template_kw)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate([ids], params)[0]

    def _drain(self, order: list[str]) -> list[RequestOutput]:
        """Step until every request in `order` finished; each result merges all of that
        request's outputs (the whole text, token ids and logprobs)."""
        merged: dict[str, RequestOutput] = {}
        num_finished = 0
        wanted = set(order)
        while num_finished < len(order):
            for out in self.engine.step():
                if out.request_id not in wanted:  # another caller's request on this engine
                    continue
                num_finished += out.finished
                if out.request_id in merged:
                    merged[out.request_id].merge(out)
                else:
                    merged[out.request_id] = out
        return [merged[rid] for rid in order]
