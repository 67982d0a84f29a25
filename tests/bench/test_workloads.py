"""Workload generators: deterministic, and the reuse accounting of docs/design.md reproduced exactly."""

from __future__ import annotations

import pytest

from agentkv.bench import workloads as wl


def test_lcg_is_radixbench_generator():
    s = 2463534242 + 5001
    expected = []
    for _ in range(4):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        expected.append(s % 49152)
    assert wl.lcg(4, 5001, 49152) == expected
    assert wl.lcg(128, 5001, 49152) == wl.lcg(128, 5001, 49152)


def test_fak_agents_accounting_exact():
    work = wl.build("fak-agents")
    prompts = wl.all_prompts(work)
    assert [len(p) for p in prompts[5]] == [128 + 24 * 6] * 5
    acc = wl.radixbench_reuse(prompts)
    assert (acc["total_tokens"], acc["reused_tokens"]) == (6360, 5512)
    assert round(acc["hit_rate"] * 100, 1) == 86.7
    assert acc["token_ceiling"] == 7.5
    # agentkv's definition (capped at len - 1, same-turn in-flight prefixes) agrees here:
    # every request strictly extends what came before, so the cap never bites.
    hits = wl.agentkv_expected_hits(prompts)
    assert sum(map(sum, hits)) == 5512
    assert hits[0] == [0, 128, 128, 128, 128]
    assert hits[1] == [152] * 5


def test_agentkv_cap_differs_from_radixbench_on_repeated_prompts():
    """A prompt sent twice: radixbench counts it all as reused; agentkv computes its last token."""
    work = wl.Workload("repeat", {}, [[[1, 2, 3]], [[]]], max_tokens=1, keep_answers=False)
    prompts = wl.all_prompts(work)
    assert wl.radixbench_reuse(prompts)["reused_tokens"] == 3
    assert wl.agentkv_expected_hits(prompts) == [[0], [2]]


def test_session_formulas_design_figures():
    assert wl.session_formulas(2048, 50, 5, 32, 64) == {
        "naive": 1_100_000,
        "warm_per_agent": 25_920,
        "shared_prefix": 17_728,
    }
    # agentkv: +1 token per agent per later turn (the answer's last token), and identical
    # turn-0 prompts each compute their last token.
    assert wl.agentkv_session_prefill(2048, 50, 5, 32, 64) == 17_728 + 5 * 49 + 4


def test_session_prediction_matches_closed_form():
    work = wl.build("session", agents=3, turns=4, prefix=40, user=8, answer=5, tool=12)
    answer = lambda t, a: [100 + t, 200 + a, 300, 400, 500]  # noqa: E731
    prompts = wl.all_prompts(work, answer)
    hits = wl.agentkv_expected_hits(prompts, answer)
    total = sum(len(p) for turn in prompts for p in turn)
    assert total == work.formulas["naive"]
    assert total - sum(map(sum, hits)) == work.formulas["agentkv_exact"]


@pytest.mark.parametrize("name", ["fak-agents", "shared-prefix", "multi-turn", "session"])
def test_generators_deterministic(name):
    a, b = wl.build(name, quick=True), wl.build(name, quick=True)
    assert a.segments == b.segments and a.params == b.params


def test_shared_prefix_shape():
    work = wl.build("shared-prefix", groups=3, prompts_per_group=2, system_len=20, question_len=5)
    row = work.segments[0]
    assert len(row) == 6 and all(len(p) == 25 for p in row)
    assert row[0][:20] == row[1][:20] != row[2][:20]
    hits = wl.agentkv_expected_hits(wl.all_prompts(work))
    assert sum(len(p) for p in row) - sum(map(sum, hits)) == work.formulas["shared_prefix"]


def test_tool_loop_is_chat_template_and_prefix_stable(smollm2_path):
    from agentkv.formats.chat_template import load_chat_template
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    source = open_model(str(smollm2_path))
    tok = load_tokenizer(source)
    work = wl.build("tool-loop", tok, quick=True)
    again = wl.build("tool-loop", tok, quick=True)
    assert work.segments == again.segments
    p = work.params
    assert len(work.segments[0][0]) == p["prefix"] + p["user"]
    assert all(len(seg) == p["tool"] for turn in work.segments[1:] for seg in turn)
    answer = tok.encode(" ok fine", add_special_tokens=False)
    prompts = wl.all_prompts(work, lambda t, a: answer * 4)
    last = prompts[-1][0]
    # Built at the token level, the transcript tokenizes back to itself...
    text = tok.decode(last)
    assert tok.encode(text, add_special_tokens=False) == last
    # ...and is what the model's chat template renders for the same messages.
    template = load_chat_template(source)
    msgs = [m for m in _messages(text)]
    rendered = template.render(msgs, add_generation_prompt=True)
    assert rendered == text


def _messages(text: str) -> list[dict]:
    out = []
    for block in text.split("<|im_start|>")[1:]:
        if not block.endswith("<|im_end|>\n"):
            continue
        role, _, content = block[: -len("<|im_end|>\n")].partition("\n")
        out.append({"role": role, "content": content})
    return out


def test_session_shape_rejects_bad_sizes():
    with pytest.raises(ValueError, match="agents=0"):
        wl.build("session", agents=0)
    with pytest.raises(ValueError, match="'turnz'"):
        wl.build("session", turnz=3)
    # Control: the same call with valid sizes builds the workload.
    assert wl.build("session", agents=1, turns=2).num_agents == 1
