"""`agentkv inspect MODEL [--json]`: architecture, tensor formats, hparams and tokenizer summary."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.errors import FormatError, TokenizerError
from agentkv.formats.resolve import open_model
from agentkv.formats.source import ModelSource

SPECIAL_TOKENS = ("bos", "eos", "unk", "pad")
_GGUF_SPECIAL_KEYS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "unk": "unknown_token_id",
    "pad": "padding_token_id",
}
KEY_HPARAMS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_theta_local",
    "sliding_window",
    "tie_embeddings",
    "attn_logit_softcap",
    "final_logit_softcap",
    "query_pre_attn_scalar",
    "pooling",
    "expert_count",
    "experts_per_token",
    "shared_experts",
    "scoring",  # DeepSeek-V3 / GLM-4.5 routers (sigmoid, groups)
    "num_groups",
    "top_groups",
    "kv_lora_rank",  # multi-head latent attention: the latent KV layout against multi-head K/V
    "qk_rope_head_dim",
    "kv_layout",
    "kv_bytes_per_token_f16",
    "kv_bytes_per_token_f16_multi_head",
    "layer_kinds",  # hybrids: R recurrent, A attention
    "snapshot_bytes",
    "kv_bytes_per_token_f32",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", help="a .gguf file, a HF folder, or an alias (smollm2, gemma3-270m, minilm)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    try:
        report = summarize(open_model(args.model))
    except FormatError as exc:
        print(f"agentkv inspect: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else render(report))
    return 0


def summarize(source: ModelSource) -> dict[str, Any]:
    """Everything `inspect` reports, as JSON-ready plain values. Reads headers only."""
    hp = source.hparams
    formats: dict[str, dict[str, int]] = {}
    for name in source.tensor_names():
        info = source.tensor(name)
        row = formats.setdefault(
            _format_name(source, name, info.qtype), {"num_tensors": 0, "num_bytes": 0, "num_params": 0}
        )
        row["num_tensors"] += 1
        row["num_bytes"] += info.num_bytes
        row["num_params"] += int(np.prod(info.shape, dtype=np.int64))
        held = {*filter(None, row.get("cpu_weights", "").split(", ")), _cpu_residency(info.qtype, info.shape)}
        row["cpu_weights"] = ", ".join(sorted(held))  # a bf16 row: "f32, resident" (vectors, matrices)
    resolved = {**{f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)}, **_family_summary(source)}
    hparams = {k: resolved.get(k) for k in KEY_HPARAMS}
    return {
        "model": str(source.path),
        "kind": source.kind,
        "arch": hp.arch,
        "num_params": sum(r["num_params"] for r in formats.values()),
        "num_tensors": sum(r["num_tensors"] for r in formats.values()),
        "num_bytes": sum(r["num_bytes"] for r in formats.values()),
        "formats": dict(sorted(formats.items())),
        "context_len": hp.context_len,
        "vocab_size": hp.vocab_size,
        "hparams": hparams,
        "sliding_window_layers": resolved.get("sliding_window_layers"),
        "tokenizer": _gguf_tokenizer(source.metadata)
        if source.kind == "gguf"
        else _folder_tokenizer(source.path, source.metadata),
        "output_formats": _output_formats(source),
    }


def _output_formats(source: ModelSource) -> dict[str, str] | None:
    """The tool-call format and reasoning parser `serve` would pick, and why (None: the model
    has no chat template, or no tokenizer, so it does not chat)."""
    from agentkv.formats.chat_template import load_chat_template
    from agentkv.formats.tokenizer import load_tokenizer
    from agentkv.server.toolformats.registry import choose, special_token_texts

    try:
        template = load_chat_template(source)
        tokens = special_token_texts(load_tokenizer(source)) if template is not None else []
    except FormatError:
        return None
    if template is None:
        return None
    found = choose(template, tokens)
    return {
        "tool_calls": found.tool_format,
        "tool_calls_why": found.tool_reason,
        "reasoning": found.reasoning,
        "reasoning_why": found.reasoning_reason,
    }


def _format_name(source: ModelSource, name: str, qtype: int) -> str:
    """The resident format, with the checkpoint's own (`gptq int4 g128 sym -> Q4_0`) where it
    is a quantized safetensors module."""
    from agentkv.formats.quants import QUANT_NAMES

    resident = QUANT_NAMES.get(qtype) or GGMLQuantizationType(qtype).name
    stored = getattr(source, "checkpoint_format", lambda _: None)(name)
    return f"{stored} -> {resident}" if stored else resident


def _family_summary(source: ModelSource) -> dict[str, Any]:
    """The hparams only the model's family knows (window pattern, pooling, ...), with its
    defaults applied; none for an architecture no family here implements."""
    from agentkv.models.registry import UnsupportedArchitecture, family_config

    try:
        return family_config(source).summary()
    except UnsupportedArchitecture:
        return {}


def _cpu_residency(qtype: int, shape: tuple[int, ...]) -> str:
    """How the cpu backend holds this tensor with --weights resident (the default): in its own
    blocks when a kernel reads them (matrices, and 3-D banks of expert matrices), else widened
    to f32."""
    from agentkv.hal.kernels.qtypes import QTYPE_BLOCK

    if qtype == GGMLQuantizationType.F32 or (qtype in (1, 30) and len(shape) != 2):  # f16/bf16 vectors
        return "f32"
    if qtype in QTYPE_BLOCK and len(shape) in (2, 3) and shape[-1] % QTYPE_BLOCK[qtype][0] == 0:
        return "resident"
    return "f32 (fallback)"


def _gguf_tokenizer(metadata: dict[str, Any]) -> dict[str, Any]:
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    special = {}
    for role, key in _GGUF_SPECIAL_KEYS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is not None:
            text = tokens[token_id] if 0 <= token_id < len(tokens) else None
            special[role] = {"id": int(token_id), "text": text}
    return {
        "kind": metadata.get("tokenizer.ggml.model"),
        "vocab_size": len(tokens),
        "special_tokens": special,
        "chat_template": "tokenizer.chat_template" in metadata,
    }


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _folder_tokenizer(folder: Path, metadata: dict[str, Any]) -> dict[str, Any]:
    tok_config = metadata.get("tokenizer_config") or {}
    has_template = bool(tok_config.get("chat_template")) or (folder / "chat_template.jinja").is_file()
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        return {"kind": None, "vocab_size": None, "special_tokens": {}, "chat_template": has_template}
    from tokenizers import Tokenizer

    try:
        kind = json.loads(tok_file.read_text(encoding="utf-8"))["model"]["type"]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise TokenizerError(f"{tok_file}: no model.type: {type(exc).__name__}: {exc}") from exc
    try:
        tokenizer = Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the tokenizers binding raises bare Exception on a bad file
        raise TokenizerError(f"{tok_file}: cannot load tokenizer: {exc}") from exc
    special = {}
    for role in SPECIAL_TOKENS:
        text = _token_text(tok_config.get(f"{role}_token"))
        if text is not None:
            special[role] = {"id": tokenizer.token_to_id(text), "text": text}
    return {
        "kind": kind,
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "special_tokens": special,
        "chat_template": has_template,
    }


def _human_bytes(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{num_bytes} B"
        size /= 1024
    raise RuntimeError("unreachable bug")


def render(report: dict[str, Any]) -> str:
    """The human-readable table."""
    tok = report["tokenizer"]
    lines = [
        f"model         {report['model']} ({report['kind']})",
        f"architecture  {report['arch']}",
        f"parameters    {report['num_params']:,} ({report['num_params'] / 1e6:.1f}M)",
        f"tensors       {report['num_tensors']}, {_human_bytes(report['num_bytes'])}",
        f"context       {report['context_len']}",
        f"vocab         {report['vocab_size']}",
        "",
        f"{'format':<8} {'tensors':>8} {'params':>14} {'bytes':>14}  cpu weights",
    ]
    for name, row in report["formats"].items():
        lines.append(
            f"{name:<8} {row['num_tensors']:>8} {row['num_params']:>14,} {row['num_bytes']:>14,}  {row['cpu_weights']}"
        )
    lines.append("")
    lines += [f"{key:<22} {value}" for key, value in report["hparams"].items() if value is not None]
    if report["sliding_window_layers"]:
        lines.append(f"{'layers (S=slide G=global)':<22} {report['sliding_window_layers']}")
    lines += ["", f"tokenizer     {tok['kind']} ({tok['vocab_size']} tokens)"]
    for role, special in tok["special_tokens"].items():
        lines.append(f"  {role:<4} {special['id']!s:>8}  {special['text']!r}")
    lines.append(f"chat template {'yes' if tok['chat_template'] else 'no'}")
    formats = report.get("output_formats")
    if formats:
        lines.append(f"tool calls    {formats['tool_calls']} ({formats['tool_calls_why']})")
        lines.append(f"reasoning     {formats['reasoning']} ({formats['reasoning_why']})")
    return "\n".join(lines)
