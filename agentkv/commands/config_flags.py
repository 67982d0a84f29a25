"""The engine's CLI flags, derived from the config tree: one `Flag` per knob of
`agentkv.runtime.config.KNOBS`, its default and type read from the owning dataclass field.

    add_engine_arguments(parser)        # MODEL plus --backend, --block-size, --kv-cache-memory ...
    config = config_from_args(args)     # the EngineConfig; a bad value raises the config's ValueError

Used by serve, generate and chat; bench can call the same two functions."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from agentkv.runtime.config import (
    ACTIVATION_CHOICES,
    DEFAULT_KV_DISK,
    DEFAULT_KV_MEMORY,
    KV_DTYPES,
    WEIGHTS_MODES,
    EngineConfig,
    engine_config,
    knob_default,
    knob_type,
    parse_size,
)
from agentkv.sched.draft import DRAFTERS

MODEL_HELP = "alias (smollm2, gemma3-270m, minilm), a .gguf file or a HF folder"


class Flag(NamedTuple):
    """How one knob reads on the command line. `parse` converts the flag's text (None: the
    field's own type); `exclusive` names a group whose flags may not be given together;
    `option` replaces the default `--knob-name`."""

    knob: str
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    exclusive: str = ""
    option: str = ""

    @property
    def flag(self) -> str:
        return self.option or "--" + self.knob.replace("_", "-")


FLAGS: dict[str, Flag] = {
    f.knob: f
    for f in (
        Flag(
            "backend",
            "compute backend: cpu (compiled kernels, the default), torch (portable), cuda (Triton kernels on an "
            "NVIDIA GPU), torch-cuda, reference",
        ),
        Flag(
            "weights", "keep quantized weights quantized (resident) or dequantize at load (f32)", choices=WEIGHTS_MODES
        ),
        Flag("max_model_len", "longest sequence in tokens (default: the model's context length)"),
        Flag("served_model_name", "the name clients use (default: MODEL)"),
        Flag("block_size", "tokens per KV block"),
        Flag("enable_prefix_cache", "share the KV of common prefixes between requests", option="--prefix-cache"),
        Flag("kv_cache_blocks", "KV cache size in blocks", exclusive="kv"),
        Flag(
            "kv_cache_memory",
            f"KV cache size, e.g. 512MiB, 2GiB (default: {DEFAULT_KV_MEMORY >> 30}GiB)",
            parse=parse_size,
            exclusive="kv",
        ),
        Flag("kv_cache_dir", "keep full KV blocks in files under DIR too: hits across evictions and restarts"),
        Flag(
            "kv_disk_size",
            f"the KV disk tier's budget, e.g. 50GiB (default: {DEFAULT_KV_DISK >> 30}GiB)",
            parse=parse_size,
        ),
        Flag("kv_write_through", "write KV blocks to disk when they are cached, not when evicted from RAM"),
        Flag(
            "activation_dtype",
            "matmul activations: int8 rounds them per 32-wide block (integer dot products); cache hits "
            "stay exact; auto: int8 where the CPU has AVX-512 VNNI, else f32",
            choices=ACTIVATION_CHOICES,
        ),
        Flag(
            "kv_cache_dtype",
            "K/V element type: f16 halves KV memory and attention bandwidth (cache hits stay exact)",
            choices=KV_DTYPES,
        ),
        Flag(
            "snapshot_every",
            "hybrid models: keep the recurrent state at every N-th KV block end, where hits resume "
            "(default: the fewest blocks that keep snapshots under 64 KiB a token)",
        ),
        Flag("max_num_seqs", "sequences running at once"),
        Flag("max_num_batched_tokens", "tokens computed per step, decodes and prefills together"),
        Flag("chunk_size", "longest prefill chunk of one sequence (default: the step's token budget)"),
        Flag(
            "speculative",
            "speculative decoding with this drafter (default: off); outputs are unchanged",
            choices=tuple(sorted(DRAFTERS)),
        ),
        Flag("num_speculative_tokens", "most tokens drafted per request per step"),
        Flag("max_queued_requests", "requests that may wait beyond --max-num-seqs; more get 429 (default: no bound)"),
        Flag("stream_stall_timeout", "end a stream whose client reads nothing for this many seconds", parse=float),
        Flag("max_pinned_blocks", "KV blocks cache_control pins may hold in all (default: half the pool)"),
        Flag("max_pinned_blocks_per_tenant", "KV blocks one tenant's pins may hold (default: a quarter of the pool)"),
    )
}


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` whose ValueError argparse reports word for word (it hides a plain ValueError)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__
    return convert


def _add_flag(target: Any, flag: Flag) -> None:
    default = knob_default(flag.knob)
    kind = knob_type(flag.knob)
    kw: dict[str, Any] = {"dest": flag.knob, "default": default, "help": flag.help}
    if kind is bool:
        kw["action"] = argparse.BooleanOptionalAction  # --prefix-cache / --no-prefix-cache
        kw["help"] += " (default: on)" if default else " (default: off)"
    else:
        kw["type"] = _argparse_type(flag.parse) if flag.parse else kind
        if flag.choices:
            kw["choices"] = flag.choices
        else:
            kw["metavar"] = flag.knob.upper()
        if default is not None:
            kw["help"] += f" (default: {default})"
    target.add_argument(flag.flag, **kw)


def add_engine_arguments(
    parser: argparse.ArgumentParser, *, knobs: Sequence[str] | None = None, model_positional: bool = True
) -> None:
    """Add MODEL (unless `model_positional` is False) and one flag per knob in `knobs`
    (default: every knob) to `parser` (mutates it)."""
    if model_positional:
        parser.add_argument("model", help=MODEL_HELP)
    groups: dict[str, Any] = {}
    for name in knobs if knobs is not None else FLAGS:
        flag = FLAGS[name]
        target = parser
        if flag.exclusive:
            if flag.exclusive not in groups:
                groups[flag.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[flag.exclusive]
        _add_flag(target, flag)


def config_from_args(args: argparse.Namespace, model: str | None = None) -> EngineConfig:
    """The EngineConfig the parsed flags describe (knobs absent from `args` keep their
    defaults). Raises the config's ValueError, naming field, value and range, for a bad one."""
    overrides = {k: getattr(args, k) for k in FLAGS if hasattr(args, k)}
    return engine_config(model if model is not None else args.model, **overrides)
