"""The `cpu` backend's model-facing fused ops: `attention_inputs` as one kernel (split, q/k
norm, rope, K/V store) and a whole decoder block as one compiled call (layer.cpp), built once
per layer and KV store. The same kernels in the same order as the base class's composition,
so the same bits, minus ~10 Python/pybind crossings a layer."""

from __future__ import annotations

import torch

from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.blocks import AttentionSpec, BlockSpec, DecoderLayer, DenseFFN, DenseFFNSpec, Projection, next_norms
from agentkv.hal.portable.backend import GLU_KINDS, TorchKV, _stacked
from agentkv.hal.portable.steps import kernel_meta, step_rows
from agentkv.hal.rope import rope_tables


class CompiledBlocks:
    """Mixed into `CpuBackend` (before the portable backend), which sets `_kernels` and
    `_rope_full`; an FFN that is not dense takes the composed path (`Backend.ffn`)."""

    def attention_inputs(
        self,
        qkv,
        meta: AttnMeta,
        kv: TorchKV,
        layer: int,
        spec: AttentionSpec,
        q_norm: Weight | None = None,
        k_norm: Weight | None = None,
    ) -> Tensor:
        rows = step_rows(meta)
        cos, sin = self._rope_full_tables(spec.rope, rows.max_pos)
        q = self._kernels.attention_inputs(
            _stacked(qkv),
            q_norm.raw if q_norm is not None else None,
            k_norm.raw if k_norm is not None else None,
            cos,
            sin,
            rows.positions,
            rows.slots,
            kv.k_slots[layer],
            kv.v_slots[layer],
            spec.num_heads,
            spec.num_kv_heads,
            spec.rope.dim,
            spec.rope.style is RopeStyle.INTERLEAVED,
            spec.eps,
            spec.unit_offset,
        )
        return Tensor(q)

    def decoder_block(
        self,
        h: Tensor,
        x: Tensor,
        layer: DecoderLayer,
        spec: BlockSpec,
        meta: AttnMeta,
        kv: TorchKV,
        index: int,
        next_norm: Weight,
    ) -> tuple[Tensor, Tensor]:
        """The block as one compiled call (layer.cpp): the same kernels in the same order as
        the default composition, so the same bits, minus ~10 Python/pybind crossings. Only a
        dense FFN runs compiled; any other FFN kind takes the composed path (`Backend.ffn`)."""
        block = self._compiled_block(layer, spec, kv, index, next_norm)
        if block is None:
            return super().decoder_block(h, x, layer, spec, meta, kv, index, next_norm)
        rows = step_rows(meta)
        cos, sin = self._rope_full_tables(spec.attention.rope, rows.max_pos)
        tables, row_seq, row_pos = kernel_meta(meta)
        hs = h.raw.contiguous()
        normed = block.run(hs, x.raw.contiguous(), cos, sin, rows.positions, rows.slots, tables, row_seq, row_pos)
        return Tensor(hs), Tensor(normed)

    def decoder_blocks(self, h, x, layers, specs, meta, kv, final_norm) -> tuple[Tensor, Tensor]:
        """Every block as one compiled call (layer.cpp's DecoderStack: each block's run in
        turn, so the same bits, minus a Python round trip per block) when every block
        compiles; else one call per block."""
        own_block = type(self).decoder_block is CompiledBlocks.decoder_block  # a subclass's own wins
        compiled = self._compiled_stack(layers, specs, kv, final_norm) if own_block else None
        if compiled is None:
            return super().decoder_blocks(h, x, layers, specs, meta, kv, final_norm)
        stack, ropes = compiled
        rows = step_rows(meta)
        tables = [self._rope_full_tables(rope, rows.max_pos) for rope in ropes]
        hs = h.raw.contiguous()
        cos, sin = [t[0] for t in tables], [t[1] for t in tables]
        normed = stack.run(hs, x.raw.contiguous(), cos, sin, rows.positions, rows.slots, *kernel_meta(meta))
        return Tensor(hs), Tensor(normed)

    def _compiled_stack(self, layers, specs, kv: TorchKV, final_norm: Weight):
        """(the DecoderStack of these layers, the distinct rope specs it indexes), built once
        per KV store and kernel mode; None when some block does not compile."""
        entry = kv.decoder_blocks.get("stack")
        if (
            entry is not None
            and entry[3] == self.int8
            and entry[2] is final_norm
            and len(entry[0]) == len(layers)
            and all(a is b for a, b in zip(entry[0], layers))
            and all(a is b for a, b in zip(entry[1], specs))
        ):
            return entry[4]
        norms = next_norms(layers, final_norm)
        blocks = [self._compiled_block(layer, specs[i], kv, i, norms[i]) for i, layer in enumerate(layers)]
        compiled = None
        if all(b is not None for b in blocks):
            ropes = tuple(dict.fromkeys(spec.attention.rope for spec in specs))
            index = [ropes.index(spec.attention.rope) for spec in specs]
            compiled = (self._kernels.DecoderStack(blocks=blocks, rope=index, tables=len(ropes)), ropes)
        kv.decoder_blocks["stack"] = (tuple(layers), tuple(specs), final_norm, self.int8, compiled)
        return compiled

    def _compiled_block(self, layer: DecoderLayer, spec: BlockSpec, kv: TorchKV, index: int, next_norm: Weight):
        """The kernel library's DecoderBlock for this layer, built once per KV store; None
        where the block needs something it does not do (an FFN that is not dense, an
        activation it lacks, a bias on only some of q/k/v)."""
        entry = kv.decoder_blocks.get(index)
        fresh = entry is not None and entry[0] is layer and entry[1] == spec and entry[2] is next_norm
        if fresh and entry[4] == self.int8:
            return entry[3]
        att, ffn = layer.attention, layer.ffn
        block = None
        if type(ffn) is DenseFFN and isinstance(spec.ffn, DenseFFNSpec) and spec.ffn.act in GLU_KINDS:
            projections = {
                name: _projection(self._kernels, p, self.int8)
                for name, p in (
                    ("qkv", att.qkv),
                    ("o", Projection((att.o,))),
                    ("gate_up", ffn.gate_up),
                    ("down", Projection((ffn.down,))),
                )
            }
            if all(p is not None for p in projections.values()):
                parts = self._block_parts(layer, spec, kv, index, next_norm)
                block = self._kernels.DecoderBlock(**projections, **parts)
        kv.decoder_blocks[index] = (layer, spec, next_norm, block, self.int8)
        return block

    def _block_parts(self, layer: DecoderLayer, spec: BlockSpec, kv: TorchKV, index: int, next_norm: Weight) -> dict:
        """The compiled block's norms, K/V store and scalars, each a small bound struct."""
        att, ffn, a, K = layer.attention, layer.ffn, spec.attention, self._kernels
        raw = lambda w: w.raw if w is not None else None  # noqa: E731
        norms = K.BlockNorms(
            ffn_norm=ffn.norm.raw,
            next_norm=next_norm.raw,
            post_attn_norm=raw(att.post_norm),
            post_ffn_norm=raw(ffn.post_norm),
            q_norm=raw(att.q_norm),
            k_norm=raw(att.k_norm),
        )
        cache = K.BlockCache(
            k_cache=kv.k_slots[index],
            v_cache=kv.v_slots[index],
            k_blocks=kv.k_blocks[index],
            v_blocks=kv.v_blocks[index],
        )
        config = K.BlockConfig(
            heads=a.num_heads,
            kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            rope_dim=a.rope.dim,
            interleaved=a.rope.style is RopeStyle.INTERLEAVED,
            window=int(a.window or 0),
            act=GLU_KINDS[spec.ffn.act],
            eps=a.eps,
            unit_offset=a.unit_offset,
            scale=a.scale,
        )
        return {"norms": norms, "cache": cache, "config": config}

    def _rope_full_tables(self, spec: RopeSpec, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cos/sin tables `[num_pos, dim/2]` covering max_pos (the kernel gathers rows)."""
        memo = self._rope_full.get(spec)
        if memo is None or memo[0] <= max_pos:
            cos_t, sin_t = rope_tables(spec, max_pos + 1)
            memo = (len(cos_t), torch.from_numpy(cos_t), torch.from_numpy(sin_t))
            self._rope_full[spec] = memo
        return memo[1], memo[2]


def _projection(kernels, proj: Projection, int8: bool):
    """A projection for the compiled block: the fused weight or its parts, and the bias of
    the joined output (None where some parts have one and others not)."""
    if proj.mixed_biases:
        return None
    weights = proj.weights
    bias = torch.cat([b.raw for b in proj.biases]) if proj.biases[0] is not None else None
    return kernels.projection(
        [w.raw for w in weights],
        [w.qtype for w in weights],
        [w.shape[0] for w in weights],
        bias,
        weights[0].shape[1],
        int8,
    )
