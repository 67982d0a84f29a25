"""`agentkv bench spec`: speculative decoding on three workloads in one run
(agentkv/bench/spec_workloads.py): copy-heavy turns that repeat or edit a tool result
(`tool-copy`), a coding session whose answers repeat or edit the agent's own previous answer
(`revise`), and open-ended turns.

Each turn runs alone (single-stream decode) through the model's chat template, greedy, on
one engine per arm: speculation off, `ngram`, `suffix`. Decode tokens/s are timed from after
the prefill step to the end of the turn. Acceptance rate = accepted / drafted tokens; mean
accepted length = tokens emitted per verification step (accepted + 1); `predictable` = the
share of answer tokens prompt lookup could have drafted. Exits 1 when any arm's tokens differ
from the plain arm's: speculation must never change an answer.

The peer arm is llama-cpp-python's `LlamaPromptLookupDecoding` on the same GGUF and the same
prompt tokens (the plain arm's sessions), with and without the draft model; skipped with its
reason when llama_cpp is not installed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.engine import add_engine_flags, engine_config
from agentkv.bench.peers import load_llamacpp, missing, skipped
from agentkv.bench.spec_workloads import WORKLOADS, limit_turns, predictable

ARMS = (None, "ngram", "suffix")
TARGETS = {"copy-heavy": 2.0, "open-ended": 0.95}  # decode speed with speculation / without


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_flags(parser)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per turn (default 128)")
    parser.add_argument(
        "--num-speculative-tokens", type=int, default=None, help="draft length limit (default: the engine's)"
    )
    parser.add_argument("--turns", type=int, default=4, help="turns per workload (at most 4)")
    parser.add_argument("--out", default="bench/out")


def _turn(engine, rid: str, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    """One turn alone: (output ids, decode seconds after the prefill step)."""
    from agentkv.runtime.params import SamplingParams

    engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    answer: list[int] = []
    for out in engine.step():  # the prefill step, which samples the first token
        answer += out.token_ids
    t0 = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            answer += out.token_ids
    return answer, time.perf_counter() - t0


def _session(engine, name: str, turns: tuple[str, ...], max_tokens: int) -> list[tuple[list[int], list[int], float]]:
    """One session's turns in order: (prompt ids, answer ids, decode seconds) per turn."""
    history, out = [], []
    for i, text in enumerate(turns):
        history.append({"role": "user", "content": text})
        rendered = engine.chat_template.render(history, add_generation_prompt=True)
        ids = engine.tokenizer.encode(rendered, add_special_tokens=False)
        answer, seconds = _turn(engine, f"{name}-{len(out)}-{i}", ids, max_tokens)
        out.append((ids, answer, seconds))
        history.append({"role": "assistant", "content": engine.tokenizer.decode(answer, skip_special_tokens=True)})
    return out


def run_arm(args, speculative: str | None, workloads: dict) -> dict:
    """One engine with `speculative`; per workload: tokens, decode tok/s, acceptance."""
    from agentkv.runtime.config import with_overrides
    from agentkv.runtime.engine import Engine

    config = engine_config(args, num_blocks=2048)
    engine = Engine(with_overrides(config, speculative=speculative, num_speculative_tokens=args.num_speculative_tokens))
    _turn(engine, "warmup", engine.tokenizer.encode("Say hi."), 4)
    result = {}
    for name, sessions in workloads.items():
        before = engine.stats()
        turns = [
            t for i, session in enumerate(sessions) for t in _session(engine, f"{name}{i}", session, args.max_tokens)
        ]
        after = engine.stats()
        drafted = after.spec_drafted_tokens - before.spec_drafted_tokens
        accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
        steps = after.spec_verify_steps - before.spec_verify_steps
        num_decoded = sum(len(answer) - 1 for _, answer, _ in turns)
        seconds = sum(s for *_, s in turns)
        result[name] = {
            "prompts": [ids for ids, _, _ in turns],
            "outputs": [answer for _, answer, _ in turns],
            "decode_tokens": num_decoded,
            "decode_s": seconds,
            "decode_tok_s": num_decoded / seconds,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_len": (accepted + steps) / steps if steps else None,
            "predictable": sum(predictable(i, a) for i, a, _ in turns) / sum(len(a) for _, a, _ in turns),
        }
        log(f"{speculative or 'off'} {name}: {result[name]['decode_tok_s']:.1f} tok/s, accepted {accepted}/{drafted}")
    return result


def run_llamacpp(args, prompts: dict[str, list[list[int]]]) -> dict:
    """llama.cpp decode tok/s on the same prompts, plain and with prompt-lookup drafts."""
    reason = missing("llamacpp")
    if reason:
        return skipped(reason)
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from agentkv.formats.resolve import resolve_model_path

    path = str(resolve_model_path(args.model))
    out = {}
    for arm, draft in (("llamacpp", None), ("llamacpp-lookup", args.num_speculative_tokens)):
        llm = load_llamacpp(path, n_ctx=4096, logits_all=draft is not None)
        if draft:
            llm.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=draft)
        out[arm] = {}
        for name in prompts:
            num, seconds = 0, 0.0
            for ids in prompts[name]:
                llm.reset()
                stream = llm.create_completion(ids, max_tokens=args.max_tokens, temperature=0.0, stream=True)
                next(stream)  # the prefill and the first token
                t0 = time.perf_counter()
                num += sum(1 for _ in stream)
                seconds += time.perf_counter() - t0
            out[arm][name] = {"decode_tokens": num, "decode_tok_s": num / seconds if seconds else None}
    return out


def _rows(arms: dict, workloads) -> list[list]:
    rows = []
    for name in workloads:
        base = arms["off"][name]
        for arm, r in ((arm, res[name]) for arm, res in arms.items()):
            same = r["outputs"] == base["outputs"]
            ratio = r["decode_tok_s"] / base["decode_tok_s"]
            rows.append(
                [
                    name,
                    arm,
                    r["decode_tokens"],
                    r["decode_tok_s"],
                    ratio,
                    r["acceptance_rate"],
                    r["mean_accepted_len"],
                    r["predictable"],
                    same,
                ]
            )
    return rows


def _target(name: str) -> float:
    return TARGETS["open-ended" if name == "open-ended" else "copy-heavy"]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.num_speculative_tokens is None:  # the engine's default, named in the report
        from agentkv.runtime.config import EngineConfig

        args.num_speculative_tokens = EngineConfig.__dataclass_fields__["num_speculative_tokens"].default
    workloads = {name: limit_turns(sessions, args.turns) for name, sessions in WORKLOADS.items()}
    arms = {arm or "off": run_arm(args, arm, workloads) for arm in ARMS}
    peer = run_llamacpp(args, {name: r["prompts"] for name, r in arms["off"].items()})
    rows = _rows(arms, workloads)
    exact = all(r[-1] for r in rows)
    for res in arms.values():
        for r in res.values():
            r.pop("outputs"), r.pop("prompts")
    payload = envelope(
        "spec",
        model=args.model,
        max_tokens=args.max_tokens,
        num_speculative_tokens=args.num_speculative_tokens,
        targets={name: _target(name) for name in workloads},
        arms=arms,
        llamacpp=peer,
        exact=exact,
    )
    head = [
        "workload",
        "arm",
        "decode tok",
        "decode tok/s",
        "vs off",
        "acceptance",
        "mean accepted len",
        "predictable",
        "same tokens",
    ]
    md = table(head, rows) + [""]
    md += [f"- target {name}: >= {_target(name):.2f} x off" for name in workloads]
    if "skipped" in peer:
        md.append(f"- llama.cpp prompt lookup: skipped ({peer['skipped']})")
    else:
        md += [
            f"- {arm} {n}: {r['decode_tok_s']:.1f} decode tok/s" for arm, res in peer.items() for n, r in res.items()
        ]
    groups = {n: {arm: res[n]["decode_tok_s"] for arm, res in arms.items()} for n in workloads}
    for arm, res in ({} if "skipped" in peer else peer).items():
        for n in workloads:
            groups[n][arm] = res[n]["decode_tok_s"]
    png = bar_plot(
        out / "spec.png", f"speculative decoding, {args.model}, greedy, single stream", groups, "decode tok/s"
    )
    md.append(f"\n![spec]({png.name})" if png else "")
    paths = write_outputs(out, "spec", payload, md)
    print_paths(paths)
    if not exact:
        print("FAILED: speculation changed the tokens", file=sys.stderr)
        return 1
    return 0
