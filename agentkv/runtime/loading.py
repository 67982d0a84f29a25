"""What an engine is built from: the model file, the backend, the weights, the tokenizer and
chat template, and the size of the KV pool that fits them."""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from agentkv.formats.chat_template import load_chat_template
from agentkv.formats.errors import ChatTemplateError
from agentkv.formats.resolve import open_model
from agentkv.formats.tokenizer import load_tokenizer
from agentkv.hal.identity import describe
from agentkv.hal.registry import lookup
from agentkv.hal.residency import check_weights_fit
from agentkv.models.base import LoadOptions
from agentkv.models.registry import load_model
from agentkv.runtime.config import DEFAULT_KV_MEMORY, EngineConfig

log = logging.getLogger("agentkv.runtime.engine")  # the engine's start log


class Loaded(NamedTuple):
    source: Any  # formats.source: the opened model file(s)
    backend: Any  # hal Backend
    model: Any  # models.base.Model
    tokenizer: Any
    chat_template: Any  # None when the model has none


def load(config: EngineConfig) -> Loaded:
    """Open the model `config` names on its backend (blocking; reads the weights)."""
    source = open_model(config.model)
    backend = lookup(config.backend, config.cache.dtype, config.activation_dtype)
    chosen = " (auto)" if config.activation_dtype == "auto" else ""
    log.info(
        "%s, kv %s, activations %s%s", describe(backend.identity), backend.kv_dtype, backend.activation_dtype, chosen
    )
    check_weights_fit(source, backend, resident=config.weights == "resident")
    model = load_model(source, backend, LoadOptions(weights=config.weights))
    try:
        template = load_chat_template(source)
    except ChatTemplateError:
        template = None
    return Loaded(source, backend, model, load_tokenizer(source), template)


def weights_summary(source: Any, model: Any) -> str:
    """Which tensors stayed quantized and which fell back to f32 (for the load log)."""
    from agentkv.formats.quants import QUANT_NAMES
    from agentkv.hal.kernels.qtypes import FILE_QTYPE

    infos = {n: source.tensor(n) for n in model.weight_formats}
    src = {n: info.qtype for n, info in infos.items()}
    held = {n: FILE_QTYPE.get(q, q) for n, q in model.weight_formats.items()}  # an interleaved copy is its file type
    kept = sum(1 for n, q in held.items() if q == src[n] and q not in (0, 1))
    moved = sorted({QUANT_NAMES.get(src[n], str(src[n])) for n, q in model.weight_formats.items() if q in FILE_QTYPE})
    fell = sorted(  # vectors (norms, biases) are f32 by design, whatever the file holds
        {QUANT_NAMES.get(src[n], str(src[n])) for n, q in held.items() if q != src[n] and len(infos[n].shape) > 1}
    )
    return (
        f"{kept} weights resident quantized"
        + (f" ({', '.join(moved)} rows interleaved for the int8 kernels)" if moved else "")
        + (f", dequantized to f32: {', '.join(fell)}" if fell else "")
    )


def pool_size(config: EngineConfig, model: Any, max_model_len: int, snapshot_every: int = 1) -> int:
    """KV blocks of the pool: `num_blocks`, or as many as the memory budget holds (at least
    one max_model_len sequence's when the budget is the default). The pool should hold one
    max_model_len sequence: when max_model_len was asked for explicitly, a smaller pool is a
    contradiction and raises; when it is the model's own context, the engine warns and
    refuses (KVCapacityError at add_request) only the requests that need more."""
    cc = config.cache
    bs = cc.block_size
    num = cc.num_blocks
    if num is None:
        # a hybrid's snapshot every snapshot_every blocks (those where prefill chunks stop come on top)
        per_block = model.kv_spec(1, bs).bytes_per_block + model.state_bytes // snapshot_every
        budget = cc.memory_bytes or DEFAULT_KV_MEMORY
        needed = math.ceil(max_model_len / bs) + 1
        num = budget // per_block
        if num < needed and cc.memory_bytes is not None:
            raise ValueError(
                f"kv cache memory {budget} bytes holds {num} blocks, fewer than one "
                f"max_model_len sequence needs ({needed}); raise it or lower max_model_len"
            )
        num = max(int(num), needed)
    capacity = num * bs
    if capacity < max_model_len:
        message = (
            f"the KV pool holds {num} blocks x {bs} = {capacity} tokens, fewer than one "
            f"max_model_len sequence ({max_model_len} tokens); "
            f"raise --kv-cache-blocks / --kv-cache-memory or lower --max-model-len"
        )
        if config.max_model_len is not None:
            raise ValueError(message)
        log.warning("%s; requests needing more than %d tokens will be refused", message, capacity)
    return num
