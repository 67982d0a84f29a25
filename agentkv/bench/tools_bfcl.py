"""BFCL's data and its own AST checker for `agentkv bench tools`.

The cases are the Berkeley Function Calling Leaderboard's (the `bfcl-eval` package's data:
`BFCL_v4_<category>.json` and `possible_answer/`), the first N of a category in file order;
the checker is BFCL's `ast_checker`, run as its OpenAI-style handlers are scored (dots in
function names written as underscores). bfcl-eval pins numpy 1.26 and pulls torch through
sentence-transformers, so it is installed without its dependencies
(`pip install --no-deps bfcl-eval==2026.3.23`) and its checker is imported with the one module
that would drag in every provider's SDK (its model registry) stood in for."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

CATEGORIES = ("simple_python", "multiple", "parallel")
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23 (its data and checker; its pins would replace numpy and torch)"
# BFCL's JSON-schema dialect -> JSON Schema (what its OpenAI handlers send).
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


class Case(NamedTuple):
    id: str
    category: str
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]  # BFCL's function docs
    answer: list[dict[str, Any]]  # BFCL's possible answers


def missing() -> str | None:
    return None if importlib.util.find_spec("bfcl_eval") is not None else f"bfcl_eval is not installed ({INSTALL})"


def load_cases(category: str, limit: int) -> list[Case]:
    """The first `limit` cases of a BFCL category (`simple_python`, `multiple`, `parallel`)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"bfcl_eval is not installed: {INSTALL}")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    questions = _jsonl(data / f"BFCL_v4_{category}.json", limit)
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json", None)}
    return [Case(q["id"], category, q["question"][0], q["function"], answers[q["id"]]) for q in questions]


def _jsonl(path: Path, limit: int | None) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"{path}: no such BFCL data file (categories: simple_python, multiple, parallel)")
    with path.open() as f:
        return [json.loads(line) for i, line in enumerate(f) if limit is None or i < limit]


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs as OpenAI tools: names with `_` for `.`, its types as JSON Schema's."""
    return [
        {
            "type": "function",
            "function": {
                "name": re.sub(r"\.", "_", f["name"]),
                "description": f.get("description", ""),
                "parameters": _schema(f.get("parameters") or {"type": "dict", "properties": {}}),
            },
        }
        for f in functions
    ]


def _schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items() if k not in ("type", "properties")}
    if isinstance(node.get("type"), str):  # (a parameter may be called "type")
        kind = _TYPES.get(node["type"], node["type"])
        if kind is not None:
            out["type"] = kind
    if "properties" in node:
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    return out


def check(case: Case, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """BFCL's verdict ({"valid": bool, "error": [...], ...}) on the calls a server returned."""
    ast_checker, python = _checker()
    output = [{name: arguments} for name, arguments in calls]
    return ast_checker(case.functions, output, case.answer, python, case.category, "agentkv")


def _checker():
    """BFCL's ast_checker and its Language.PYTHON; its model registry (every provider's SDK)
    stood in for by one that says each model writes `_` for `.` in names, as OpenAI's do."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.MODEL_CONFIG_MAPPING = defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=True))
        sys.modules[name] = stand_in
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language.PYTHON
