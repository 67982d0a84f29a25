"""`agentkv bench tools`' scoring: BFCL's cases become OpenAI tools our server accepts, and
BFCL's own AST checker passes each category's first possible answer (sent back as a server
would, names with `_` for `.`) and fails it with one value changed (the control). Skipped
where bfcl-eval is not installed (its pins keep it out of the extras: tools_bfcl.INSTALL)."""

from __future__ import annotations

import re

import pytest

from agentkv.bench import tools_bfcl
from agentkv.server.schemas import ToolDef

pytestmark = pytest.mark.skipif(tools_bfcl.missing() is not None, reason=str(tools_bfcl.missing()))


def _first_answer(case) -> list[tuple[str, dict]]:
    calls = []
    for call in case.answer:
        (name, params), *_ = call.items()
        calls.append((re.sub(r"\.", "_", name), {k: v[0] for k, v in params.items() if v[0] != ""}))
    return calls


@pytest.mark.parametrize("category", tools_bfcl.CATEGORIES)
def test_bfcl_answers_pass_its_checker_and_a_changed_one_fails(category):
    cases = tools_bfcl.load_cases(category, 1000)
    for case in cases:  # every case's tools (one has a parameter called "type")
        for tool in tools_bfcl.openai_tools(case.functions):
            ToolDef.model_validate(tool)
    for case in cases[:5]:
        calls = _first_answer(case)
        assert tools_bfcl.check(case, calls)["valid"], case.id
        name, args = calls[0]
        key = next(iter(args))
        wrong = [
            (name, {**args, key: [args[key]] if not isinstance(args[key], list) else args[key] + ["x"]}),
            *calls[1:],
        ]
        assert not tools_bfcl.check(case, wrong)["valid"], case.id
