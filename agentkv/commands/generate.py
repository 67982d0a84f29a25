"""`agentkv generate MODEL PROMPT... [sampling flags]`: complete prompts, batched."""

from __future__ import annotations

import json
import sys

from agentkv.commands.common import add_model_arguments, add_sampling_arguments, sampling_params
from agentkv.commands.config_flags import config_from_args
from agentkv.formats.errors import FormatError
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.identity import describe


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("prompt", nargs="+", help="prompt text (several prompts run as one batch)")
    add_sampling_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")


def run(args) -> int:
    from agentkv.runtime.llm import LLM

    try:
        params = sampling_params(args)
        llm = LLM(config_from_args(args))
        print(describe(llm.engine.backend.identity), file=sys.stderr)
        outputs = llm.generate(list(args.prompt), params)
    except (FormatError, ValueError, BackendUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": out.text,
                        "token_ids": out.token_ids,
                        "finish_reason": out.finish_reason,
                        "prompt_len": out.prompt_len,
                        "cached_len": out.cached_len,
                        "logprobs": [lp._asdict() for lp in out.logprobs] if out.logprobs else None,
                    }
                )
            )
        else:
            print(prompt + out.text)
    return 0
