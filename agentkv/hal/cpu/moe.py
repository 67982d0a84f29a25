"""The `cpu` backend's expert dispatch: routing in torch (hal/portable/moe.py's `route`), the
routed experts as one compiled call per layer (kernels/moe.cpp's MoEExperts, built once per
layer), then the shared expert. The same kernels in the same order as `grouped_moe` on this
backend, so the same bits, without the per-expert Python and pybind crossings."""

from __future__ import annotations

from agentkv.hal.base import Layout, Tensor
from agentkv.hal.blocks import Experts, MoEFFN, MoEFFNSpec
from agentkv.hal.kernels import SUPPORTED_QTYPES
from agentkv.hal.portable.backend import GLU_KINDS
from agentkv.hal.portable.moe import add_shared, grouped_moe, route, score_bias


class CompiledExperts:
    """Mixed into `CpuBackend`, which sets `_kernels`; MoE layers whose experts the kernel
    cannot take (an activation it lacks, another weight layout) run `grouped_moe`."""

    def moe_ffn(self, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec) -> Tensor:
        compiled = self._compiled_experts(weights.experts, spec)
        if compiled is None:
            return grouped_moe(self, x, weights, spec)
        chosen, probs = route(self.matmul(x, weights.router).raw, spec, score_bias(weights))
        xs = x.raw.contiguous()
        routed = compiled.run(xs, chosen.contiguous(), probs.contiguous())
        return add_shared(self, x, weights, spec, routed)

    def _compiled_experts(self, experts: Experts, spec: MoEFFNSpec):
        """The kernel library's MoEExperts for this layer (built on first use, kept while the
        backend lives), or None where the kernel does not run these experts."""
        memo = self.__dict__.setdefault("_moe_experts", {})
        entry = memo.get(id(experts))
        if entry is not None and entry[0] is experts and entry[1] == spec.act:
            return entry[2]
        memo[id(experts)] = (experts, spec.act, self._build_experts(experts, spec))
        return memo[id(experts)][2]

    def _build_experts(self, experts: Experts, spec: MoEFFNSpec):
        banks = (experts.gate, experts.up, experts.down)
        if spec.act not in GLU_KINDS or not all(_uniform(bank) for bank in banks):
            return None
        qtypes = [_qtype(bank[0]) for bank in banks]
        f, d = experts.gate[0].shape
        return self._kernels.moe_experts(
            *([w.raw for w in bank] for bank in banks), qtypes=qtypes, d=d, f=f, act=GLU_KINDS[spec.act]
        )


def _qtype(w) -> int:
    return w.qtype if w.layout is Layout.GGUF_ROWS else 0


def _uniform(bank) -> bool:
    """Every expert of one projection in one shape, layout and qtype that the kernel reads."""
    first = bank[0]
    if first.layout is Layout.GGUF_ROWS and first.qtype not in SUPPORTED_QTYPES:
        return False
    return first.layout in (Layout.GGUF_ROWS, Layout.ROW_MAJOR_F32) and all(
        w.shape == first.shape and w.layout is first.layout and w.qtype == first.qtype for w in bank
    )
