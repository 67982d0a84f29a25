"""A call's pieces (toolformats' CallGrammar pieces, plain data) as xgrammar structural-tag
formats, for free text in which calls, once begun, follow the family's grammar."""

from __future__ import annotations

import json
from typing import Any


def tag_format(tag: tuple[str, list[Any], str]) -> dict[str, Any]:
    begin, pieces, end = tag
    return {"type": "tag", "begin": begin, "content": _sequence(pieces), "end": end}


def _sequence(pieces: list[Any]) -> dict[str, Any]:
    """Pieces as a structural tag's content format."""
    kinds = {
        "lit": lambda v: {"type": "const_string", "value": v},
        "json": lambda v: {"type": "grammar", "grammar": _spaced_json(v)},
        "regex": lambda v: {"type": "regex", "pattern": v},
        "ebnf": lambda v: {"type": "grammar", "grammar": f"root ::= {v}"},
        "star": lambda v: {"type": "star", "content": _sequence(v)},
        "or": lambda v: {"type": "or", "elements": [_sequence(p) for p in v]},
        "tags": lambda v: {
            "type": "tags_with_separator",
            "tags": [tag_format(t) for t in v[0]],
            "separator": v[1],
            "at_least_one": True,
        },
    }
    elements = [kinds[kind](value) for kind, value in pieces] or [kinds["lit"]("")]
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def _spaced_json(schema: Any) -> str:
    """EBNF of JSON valid against `schema`, spaced as `call_grammar` writes it (structural
    tags' own JSON allows any whitespace, which a template never writes back)."""
    import xgrammar as xgr

    return str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": ")))


def schemas_in(pieces: list[Any]) -> list[Any]:
    """The JSON schemas among `pieces`, nested ones included."""
    found: list[Any] = []
    for kind, value in pieces:
        if kind == "json":
            found.append(value)
        elif kind == "star":
            found += schemas_in(value)
        elif kind == "or":
            found += [s for p in value for s in schemas_in(p)]
        elif kind == "tags":
            found += [s for _, p, _ in value[0] for s in schemas_in(p)]
    return found
