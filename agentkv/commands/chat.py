"""`agentkv chat MODEL`: interactive chat through the model's template, streaming tokens.

`/reset` starts over; Ctrl-D (end of input) quits. Each turn reuses the KV of the previous
ones through the prefix cache, so only the new message is prefilled."""

from __future__ import annotations

import sys

from agentkv.commands.common import add_model_arguments, add_sampling_arguments, sampling_params
from agentkv.commands.config_flags import config_from_args
from agentkv.formats.errors import FormatError


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.add_argument("--system", default=None, help="system prompt")


def run(args) -> int:
    from agentkv.runtime.llm import LLM

    try:
        params = sampling_params(args)
        llm = LLM(config_from_args(args))
    except (FormatError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = llm.engine
    if engine.chat_template is None:
        print(f"error: {args.model} has no chat template", file=sys.stderr)
        return 2
    history = _fresh(args.system)
    print("agentkv chat — /reset to start over, Ctrl-D to quit", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() == "/reset":
            history = _fresh(args.system)
            print("(conversation reset)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        prompt = engine.chat_template.render(history, add_generation_prompt=True)
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        turn += 1
        try:
            engine.add_request(f"chat-{turn}", ids, params)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            history.pop()
            continue
        text = _stream(engine)
        history.append({"role": "assistant", "content": text})


def _fresh(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def _stream(engine) -> str:
    text = ""
    while engine.has_unfinished():
        for out in engine.step():
            sys.stdout.write(out.text)
            sys.stdout.flush()
            text += out.text
    sys.stdout.write("\n")
    return text
