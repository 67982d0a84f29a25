"""The `cpu` backend's expert dispatch: routing in torch (hal/portable/moe.py's `route`), the
routed experts as one compiled call per layer (kernels/moe.cpp's MoEExperts, built once per
layer), then the shared expert. The same kernels in the same order as `grouped_moe` on this
backend, so the same bits, without the per-expert Python and pybind crossings.

gpt-oss's biased experts (hal/biased_moe.py) take the same call with their biases and the
clamped SwiGLU (act 2, fused.cpp's exp rather than torch's: the compiled path is this
backend's only path for them wherever the kernel takes the experts). In the backend's int8
mode the experts' matmuls take the int8 kernels, as `self.matmul` does on the composed path."""

from __future__ import annotations

from agentkv.hal.base import Layout, Tensor
from agentkv.hal.biased_moe import BiasedMoEFFN, BiasedMoEFFNSpec, grouped_biased_moe
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

    def biased_moe_ffn(self, x: Tensor, weights: BiasedMoEFFN, spec: BiasedMoEFFNSpec) -> Tensor:
        """gpt-oss's experts: the router with its bias, then one compiled call."""
        logits = self.matmul(x, weights.router, weights.router_bias)
        compiled = self._compiled_experts(weights.experts, spec, weights)
        if compiled is None:
            return grouped_biased_moe(self, x, weights, spec, logits.raw)
        chosen, probs = route(logits.raw, spec.routing)
        return Tensor(compiled.run(x.raw.contiguous(), chosen.contiguous(), probs.contiguous()))

    def _compiled_experts(self, experts: Experts, spec, biased: BiasedMoEFFN | None = None):
        """The kernel library's MoEExperts for this layer (built on first use, kept while the
        backend lives), or None where the kernel does not run these experts."""
        memo = self.__dict__.setdefault("_moe_experts", {})
        entry = memo.get(id(experts))
        if entry is not None and entry[0] is experts and entry[1] == (spec, self.int8):
            return entry[2]
        memo[id(experts)] = (experts, (spec, self.int8), self._build_experts(experts, spec, biased))
        return memo[id(experts)][2]

    def _build_experts(self, experts: Experts, spec, biased: BiasedMoEFFN | None):
        banks = (experts.gate, experts.up, experts.down)
        if (biased is None and spec.act not in GLU_KINDS) or not all(_uniform(bank) for bank in banks):
            return None
        qtypes = [_qtype(bank[0]) for bank in banks]
        f, d = experts.gate[0].shape
        lists = [[w.raw for w in bank] for bank in banks]
        if biased is None:
            return self._kernels.moe_experts(*lists, qtypes=qtypes, d=d, f=f, act=GLU_KINDS[spec.act], int8=self.int8)
        biases = [[b.raw.reshape(-1).float().contiguous() for b in bank] for bank in _bias_banks(biased)]
        return self._kernels.moe_experts(
            *lists,
            qtypes=qtypes,
            d=d,
            f=f,
            act=CLAMPED_SWIGLU,
            biases=biases,
            alpha=spec.alpha,
            limit=spec.limit,
            int8=self.int8,
        )


CLAMPED_SWIGLU = 2  # moe.cpp's act code for gpt-oss's clamped SwiGLU


def _bias_banks(w: BiasedMoEFFN):
    return w.gate_bias, w.up_bias, w.down_bias


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
