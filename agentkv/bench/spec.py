"""`agentkv bench spec`: speculative decoding on two workloads in one run.

  copy-heavy  agent turns whose answer repeats or edits a tool result (a file, a JSON record)
  open-ended  turns the context cannot predict (stories, explanations)

Each turn runs alone (single-stream decode) through the model's chat template, greedy, on
one engine per arm: speculation off, `ngram`, `suffix`. Decode tokens/s are timed from after
the prefill step to the end of the turn. Acceptance rate = accepted / drafted tokens; mean
accepted length = tokens emitted per verification step (accepted + 1). Exits 1 when any arm's
tokens differ from the plain arm's: speculation must never change an answer.

The peer arm is llama-cpp-python's `LlamaPromptLookupDecoding` on the same GGUF, with and
without the draft model; skipped with its reason when llama_cpp is not installed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.engine import add_engine_flags, engine_config
from agentkv.bench.peers import load_llamacpp, missing, skipped

ARMS = (None, "ngram", "suffix")
FILE = (
    "import json\nfrom pathlib import Path\n\n\ndef load_config(path):\n"
    '    """Read the JSON config at path and check its version."""\n'
    "    data = json.loads(Path(path).read_text())\n    if data.get('version') != 2:\n"
    "        raise ValueError(f'unsupported config version: {data.get(\"version\")}')\n"
    "    return data\n\n\ndef save_config(path, data):\n"
    "    Path(path).write_text(json.dumps(data, indent=2))\n"
)
RECORD = '{"id": 4821, "name": "disk-usage", "status": "ok", "hosts": ["web-1", "web-2", "db-1"], "used_gb": 412}'
COPY_TURNS = (
    f"Tool result (read_file config.py):\n{FILE}\nRepeat the file exactly, with no comment.",
    f"Tool result (read_file config.py):\n{FILE}\nRewrite the file with load_config renamed to read_config.",
    f'Tool result (get_check):\n{RECORD}\nReturn the same JSON record with status set to "failed".',
    f"Tool result (read_file config.py):\n{FILE}\nShow the file again with version 2 changed to 3.",
)
OPEN_TURNS = (
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give three ideas for a weekend trip near the mountains.",
    "Describe your ideal breakfast in a few sentences.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_flags(parser)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per turn (default 128)")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="draft length limit (default 3)")
    parser.add_argument("--turns", type=int, default=4, help="turns per workload (at most 4)")
    parser.add_argument("--out", default="bench/out")


def _prompt(engine, text: str) -> list[int]:
    rendered = engine.chat_template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return engine.tokenizer.encode(rendered, add_special_tokens=False)


def _turn(engine, rid: str, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    """One turn alone: (output ids, decode seconds after the prefill step)."""
    from agentkv.runtime.params import SamplingParams

    engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    final = None
    for out in engine.step():  # the prefill step, which samples the first token
        final = out if out.finished else final
    t0 = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            final = out if out.finished else final
    return final.token_ids, time.perf_counter() - t0


def run_arm(args, speculative: str | None, workloads: dict[str, tuple[str, ...]]) -> dict:
    """One engine with `speculative`; per workload: tokens, decode tok/s, acceptance."""
    from agentkv.runtime.config import with_overrides
    from agentkv.runtime.engine import Engine

    config = with_overrides(
        engine_config(args, num_blocks=2048),
        speculative=speculative,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    engine = Engine(config)
    _turn(engine, "warmup", _prompt(engine, "Say hi."), 4)
    result = {}
    for name, turns in workloads.items():
        before = engine.stats()
        outputs, seconds = [], 0.0
        for i, text in enumerate(turns):
            ids, s = _turn(engine, f"{name}-{i}", _prompt(engine, text), args.max_tokens)
            outputs.append(ids)
            seconds += s
        after = engine.stats()
        drafted = after.spec_drafted_tokens - before.spec_drafted_tokens
        accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
        steps = after.spec_verify_steps - before.spec_verify_steps
        num_decoded = sum(len(o) - 1 for o in outputs)
        result[name] = {
            "outputs": outputs,
            "decode_tokens": num_decoded,
            "decode_s": seconds,
            "decode_tok_s": num_decoded / seconds,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_len": (accepted + steps) / steps if steps else None,
        }
        log(f"{speculative or 'off'} {name}: {result[name]['decode_tok_s']:.1f} tok/s, accepted {accepted}/{drafted}")
    return result


def run_llamacpp(args, workloads: dict[str, tuple[str, ...]], prompts: dict[str, list[list[int]]]) -> dict:
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
        for name in workloads:
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
        base = arms["off"][name]["decode_tok_s"]
        for arm, res in arms.items():
            r = res[name]
            rows.append(
                [
                    name,
                    arm,
                    r["decode_tokens"],
                    r["decode_tok_s"],
                    r["decode_tok_s"] / base,
                    r["acceptance_rate"],
                    r["mean_accepted_len"],
                    r["outputs"] == arms["off"][name]["outputs"],
                ]
            )
    return rows


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    workloads = {"copy-heavy": COPY_TURNS[: args.turns], "open-ended": OPEN_TURNS[: args.turns]}
    arms = {arm or "off": run_arm(args, arm, workloads) for arm in ARMS}
    from agentkv.runtime.engine import Engine

    probe = Engine(engine_config(args, num_blocks=64))
    prompts = {n: [_prompt(probe, t) for t in turns] for n, turns in workloads.items()}
    peer = run_llamacpp(args, workloads, prompts)
    rows = _rows(arms, workloads)
    exact = all(r[-1] for r in rows)
    for res in arms.values():
        for r in res.values():
            r.pop("outputs")
    payload = envelope(
        "spec",
        model=args.model,
        max_tokens=args.max_tokens,
        num_speculative_tokens=args.num_speculative_tokens,
        arms=arms,
        llamacpp=peer,
        exact=exact,
    )
    md = table(
        ["workload", "arm", "decode tok", "decode tok/s", "vs off", "acceptance", "mean accepted len", "same tokens"],
        rows,
    ) + [""]
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
