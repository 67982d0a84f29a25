"""Grammar constraints with the real SmolLM2 tokenizer: masks admit exactly the grammar's
continuations, padded ids and special tokens are never allowed, and a grammar ends itself."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.formats.resolve import open_model
from agentkv.formats.tokenizer import load_tokenizer
from agentkv.runtime.structured import ConstraintFactory, tool_call_schema

PAD = 64  # model logits wider than the vocabulary, as padded embeddings are
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(open_model("smollm2"))


@pytest.fixture(scope="module")
def factory(tokenizer):
    return ConstraintFactory(tokenizer, tokenizer.vocab_size + PAD)


def walk(constraint, ids):
    """Feed `ids`, checking each is allowed; returns the masks seen."""
    masks = []
    for token_id in ids:
        mask = constraint.allowed_mask()
        assert mask[token_id], token_id
        masks.append(mask)
        assert not constraint.is_finished()
        constraint.accept(token_id)
    return masks


def test_schema_mask_shape_and_forbidden_ids(factory, tokenizer):
    constraint = factory.json_schema(SCHEMA)
    mask = constraint.allowed_mask()
    assert mask.dtype == bool and mask.shape == (tokenizer.vocab_size + PAD,)
    assert not mask[tokenizer.vocab_size :].any()
    assert not mask[sorted(tokenizer.special_ids)].any()
    assert {tokenizer.id_to_token(i) for i in np.flatnonzero(mask)} == {"{", '{"'}


def test_schema_accepts_valid_and_finishes(factory, tokenizer):
    constraint = factory.json_schema(SCHEMA)
    masks = walk(constraint, tokenizer.encode('{"city": "Paris", "days": 3}', add_special_tokens=False))
    assert constraint.is_finished()
    # Inside the integer, only digits (and the closing brace) may follow: never a quote.
    assert not masks[-1][tokenizer.token_to_id('"')]


def test_schema_rejects_wrong_key(factory, tokenizer):
    constraint = factory.json_schema(SCHEMA)
    walk(constraint, tokenizer.encode('{"', add_special_tokens=False))
    assert not constraint.allowed_mask()[tokenizer.encode("name", add_special_tokens=False)[0]]


def test_json_object(factory, tokenizer):
    constraint = factory.json_object()
    walk(constraint, tokenizer.encode('{"a": [1, 2]}', add_special_tokens=False))
    assert constraint.is_finished()


def test_tool_call_grammar(factory, tokenizer):
    constraint = factory.tool_call([TOOL, {"type": "function", "function": {"name": "noop"}}])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    walk(constraint, tokenizer.encode(text, add_special_tokens=False))
    assert constraint.is_finished()


def test_named_tool_forbids_other_names(factory, tokenizer):
    constraint = factory.tool_call([TOOL])
    walk(constraint, tokenizer.encode('<tool_call>\n{"name": "', add_special_tokens=False))
    mask = constraint.allowed_mask()
    assert mask[tokenizer.encode("get", add_special_tokens=False)[0]]
    assert not mask[tokenizer.encode("noop", add_special_tokens=False)[0]]


def test_compiled_grammars_are_cached(factory):
    a, b = factory.json_schema(SCHEMA), factory.json_schema(dict(reversed(SCHEMA.items())))
    assert a._matcher is not b._matcher and len(factory._cache) >= 1
    before = len(factory._cache)
    factory.json_schema(SCHEMA)
    assert len(factory._cache) == before


def test_unsupported_schema_is_a_value_error(factory):
    with pytest.raises(ValueError):
        factory.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


def test_tool_call_schema_single_and_many():
    assert tool_call_schema([TOOL])["properties"]["name"] == {"const": "get_weather"}
    assert len(tool_call_schema([TOOL, TOOL])["anyOf"]) == 2


@pytest.mark.parametrize(
    "schema",
    [
        {"anyOf": []},
        {"enum": []},
        False,
        {"oneOf": [{"enum": []}, {"anyOf": []}]},
        {"type": "object", "properties": {"a": {"anyOf": []}}, "required": ["a"]},
        {"allOf": [{"type": "string"}, {"anyOf": []}]},
    ],
)
def test_schema_that_admits_nothing_is_refused_when_built(factory, schema):
    with pytest.raises(ValueError, match="admits no JSON value"):
        factory.json_schema(schema)


def test_tool_whose_parameters_admit_nothing_is_refused(factory):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"anyOf": []}}}
    with pytest.raises(ValueError, match=r"properties\.arguments\.anyOf"):
        factory.tool_call([tool])


def test_satisfiable_schemas_with_empty_parts_still_compile(factory):
    # An optional property that can never be present, and `false` as additionalProperties.
    schema = {
        "type": "object",
        "properties": {"a": {"anyOf": []}, "b": {"type": "integer"}},
        "required": ["b"],
        "additionalProperties": False,
    }
    assert factory.json_schema(schema).allowed_mask().any()
    assert factory.json_schema({"anyOf": [{"anyOf": []}, {"type": "integer"}]}).allowed_mask().any()
