"""The compute contract: tensor and weight handles, attention metadata, the abstract backend.

A model only ever calls whole operations on a `Backend`; it never sees the array type
behind a handle. Host reads are explicit fences (`read`, `argmax`): nothing else syncs.

Batch invariance is part of the contract (docs/design.md, "exactness"): for every op, the bits
of one row's result depend only on that row's inputs, never on how many rows share the
call, where a chunk starts, or what else is in the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from agentkv.hal.handles import (  # noqa: F401  (re-exported: the contract)
    ACTIVATION_TENSOR_DTYPE,
    WEIGHT_RESIDENCY,
    BackendUnavailable,
    Capabilities,
    Tensor,
    Weight,
)
from agentkv.hal.identity import Identity, fingerprint_of
from agentkv.hal.layout import Layout, LayoutError, check_layout  # noqa: F401  (re-exported: the contract)
from agentkv.hal.recurrent_ops import RecurrentOps
from agentkv.hal.specs import (  # noqa: F401
    ACTIVATION_DTYPES,
    KV_DTYPES,
    AttnMeta,
    KVSpec,
    RopeSpec,
    RopeStyle,
    check_activation_dtype,
    check_kv_dtype,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentkv.hal.blocks import AttentionSpec, BlockSpec, DecoderLayer

BackendClass = Literal["reference", "approx"]


class Backend(RecurrentOps, ABC):
    """Whole-op compute backend. Subclasses set `name` and `klass` and implement every op
    (the recurrent layers' ops and their numpy defaults: hal/recurrent_ops.py).

    Shapes below: n = rows (tokens), d = hidden, h = heads, hd = head_dim."""

    name: str = "abstract"
    klass: BackendClass = "approx"
    activation_dtype: str = "f32"
    kv_dtype: str = "f32"

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @property
    def identity(self) -> Identity:
        return Identity(self.name, self.capabilities.device, None, None)

    def set_kv_dtype(self, dtype: str) -> Backend:
        """Choose the element type of the KV stores this backend allocates (KV_DTYPES; mutates,
        returns self). Part of the fingerprint: f16 KV rounds K/V at the store, so its bits
        differ from f32 KV's. Set it before the first `allocate_kv`."""
        self.kv_dtype = check_kv_dtype(dtype)
        return self

    def set_activation_dtype(self, dtype: str) -> Backend:
        """Choose what the matmuls take as activations (ACTIVATION_DTYPES, or "auto": the first
        of `activation_dtypes()`; mutates, returns self; part of the fingerprint, so set it before
        the first forward). A type without kernels here is a ValueError naming why."""
        dtype, offered = check_activation_dtype(dtype), self.activation_dtypes()
        dtype = offered[0] if dtype == "auto" else dtype
        if dtype not in offered:
            raise ValueError(f"activation_dtype={dtype!r}: backend {self.name!r} has no {dtype} matmul kernels")
        self.activation_dtype = dtype
        return self

    def activation_dtypes(self) -> tuple[str, ...]:
        """The activation types this backend's matmuls can take here, the faster first."""
        return ("f32",)

    def check_kv_spec(self, spec: KVSpec) -> KVSpec:
        """`spec` when its dtype is this backend's `kv_dtype` (the one in the fingerprint);
        a ValueError naming both otherwise, so no store holds bits the fingerprint denies."""
        if spec.dtype == self.kv_dtype:
            return spec
        have = f"backend {self.name!r} has kv_dtype={self.kv_dtype!r}"
        raise ValueError(f"KVSpec.dtype={spec.dtype!r} but {have}; call set_kv_dtype({spec.dtype!r}) first")

    @property
    def fingerprint(self) -> str:
        """The key for anything cached from this backend's bits (identity + dtypes)."""
        return fingerprint_of(self.identity, self.activation_dtype, self.kv_dtype)

    # -- data in and out ------------------------------------------------------------------
    @abstractmethod
    def upload(self, array: np.ndarray) -> Tensor:
        """Copy a host array (activations, ids) onto the backend."""

    @abstractmethod
    def upload_weight(
        self, name: str, data: np.ndarray, qtype: int, shape: tuple[int, ...], resident: bool = True
    ) -> Weight:
        """Make a weight resident. `data` is raw blocks for quantized qtypes (as a GGUF holds
        them) or a float array. With `resident`, a qtype in `resident_qtypes` stays quantized;
        otherwise it is dequantized to f32 once, here."""

    @abstractmethod
    def read(self, x: Tensor) -> np.ndarray:
        """Fence: wait for x and return it as a float32 host array."""

    @abstractmethod
    def argmax(self, x: Tensor) -> np.ndarray:
        """Fence: per-row argmax of `[n, v]` as int64 `[n]` (lowest index wins a tie)."""

    # -- shape plumbing -------------------------------------------------------------------
    @abstractmethod
    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor: ...

    @abstractmethod
    def take_rows(self, x: Tensor, rows: np.ndarray) -> Tensor:
        """Rows of `[n, ...]` by index (e.g. each sequence's last token before the head)."""

    def fuse_rows(self, weights: list[Weight], name: str) -> Weight | None:
        """`weights`' rows stacked (q, k, v) as one weight, columns as before; None: no fusing."""
        return None

    def split(self, x: Tensor, sizes: list[int]) -> list[Tensor]:
        """Views of `[n, sum(sizes)]` split along the last dim."""
        raise NotImplementedError(f"{self.name}: split")

    # -- ops ------------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, weight: Weight, ids: np.ndarray) -> Tensor:
        """`[vocab, d]` table, int ids `[n]` -> `[n, d]`."""

    @abstractmethod
    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        """`[n, k] @ weight[out, k].T (+ bias[out])` -> `[n, out]`."""

    def matmuls(self, x: Tensor, weights: Sequence[Weight], biases: Sequence[Weight | None] = ()) -> list[Tensor]:
        """`[x @ w.T (+ b)]` of one input, each with its own `matmul`'s bits (maybe one op)."""
        return [self.matmul(x, w, b) for w, b in zip(weights, tuple(biases) or (None,) * len(weights))]

    @abstractmethod
    def rms_norm(self, x: Tensor, weight: Weight, eps: float, unit_offset: bool = False) -> Tensor:
        """RMSNorm over the last dim; gain is `1 + w` when `unit_offset` (gemma)."""

    @abstractmethod
    def layer_norm(self, x: Tensor, weight: Weight, bias: Weight | None, eps: float) -> Tensor: ...

    @abstractmethod
    def rope(self, x: Tensor, positions: np.ndarray, spec: RopeSpec) -> Tensor:
        """Rotary embedding on `[n, h, hd]` at int positions `[n]` (first `spec.dim` dims)."""

    @abstractmethod
    def gated_act(self, gate: Tensor, up: Tensor, kind: str) -> Tensor:
        """`act(gate) * up` for kind in {"silu", "gelu_tanh", "gelu"}."""

    @abstractmethod
    def act(self, x: Tensor, kind: str) -> Tensor:
        """Plain activation (BERT's GELU)."""

    # -- fused glue (defaults composed from the ops above; a backend may fuse them) ---------
    def add_norm(
        self,
        h: Tensor,
        delta: Tensor,
        weight: Weight,
        eps: float,
        unit_offset: bool = False,
        post_weight: Weight | None = None,
    ) -> tuple[Tensor, Tensor]:
        """A residual step and the next norm: `h_new = h + (rms_norm(delta, post_weight) if
        post_weight else delta)`, `normed = rms_norm(h_new, weight)`; h, delta `[n, d]` ->
        (h_new, normed), both `[n, d]`. Covers llama's `h + attn; ffn_norm(h)` and gemma's
        sandwich `h + post_norm(attn); ffn_norm(h)`. May reuse h's storage for h_new: the
        caller must not use the old h afterwards."""
        if post_weight is not None:
            delta = self.rms_norm(delta, post_weight, eps, unit_offset)
        h_new = self.add(h, delta)
        return h_new, self.rms_norm(h_new, weight, eps, unit_offset)

    def glu(self, x: Tensor | list[Tensor], kind: str) -> Tensor:
        """`act(gate) * up` of the fused gate|up projection `[n, 2f]` (gate = first half) ->
        `[n, f]`; also takes the pair `[gate, up]` of an unfused layer. Kinds as `gated_act`."""
        if isinstance(x, (list, tuple)):
            gate, up = x
        else:
            width = x.shape[-1]
            if width % 2:
                raise ValueError(f"glu: gate|up width must be even, got {width} (shape {x.shape})")
            gate, up = self.split(x, [width // 2, width // 2])
        return self.gated_act(gate, up, kind)

    def attention_inputs(
        self,
        qkv: Tensor | list[Tensor],
        meta: AttnMeta,
        kv: Any,
        layer: int,
        spec: AttentionSpec,
        q_norm: Weight | None = None,
        k_norm: Weight | None = None,
    ) -> Tensor:
        """Everything between the q/k/v projection and attention. `qkv` is the fused
        projection `[n, (h + 2 kvh) hd]` or the list `[q, k, v]` of an unfused layer:

            qkv row:  | q: h * hd | k: kvh * hd | v: kvh * hd |

        Applies the optional per-head RMSNorm (`q_norm`/`k_norm` `[hd]`, qwen3/gemma3; with
        `spec.eps`, `spec.unit_offset`), `spec.rope` at `meta.positions` to q and k, stores k
        and v at `meta.slot_mapping` (mutates kv); returns q `[n, h, hd]`."""
        sizes = spec.qkv_sizes
        if isinstance(qkv, (list, tuple)):
            parts = list(qkv)
        else:
            if qkv.shape[-1] != sum(sizes):
                raise ValueError(
                    f"attention_inputs: qkv has {qkv.shape[-1]} columns, expected "
                    f"(num_heads + 2 * num_kv_heads) * head_dim = {sum(sizes)}"
                )
            parts = self.split(qkv, sizes)
        n, hd = parts[0].shape[0], spec.head_dim
        q, k, v = (
            self.reshape(p, (n, heads, hd))
            for p, heads in zip(parts, (spec.num_heads, spec.num_kv_heads, spec.num_kv_heads))
        )
        if q_norm is not None:
            q = self.rms_norm(q, q_norm, spec.eps, spec.unit_offset)
        if k_norm is not None:
            k = self.rms_norm(k, k_norm, spec.eps, spec.unit_offset)
        q, k = self.rope(q, meta.positions, spec.rope), self.rope(k, meta.positions, spec.rope)
        self.kv_store(kv, layer, k, v, meta.slot_mapping)
        return q

    def ffn(self, x: Tensor, weights: Any, spec: Any) -> Tensor:
        """The FFN on its normed input `x` `[n, d]` -> `[n, d]` (before its post norm), by the
        weights' kind: `hal.blocks.ffn_op` dispatches on their type (DenseFFN: gate|up, glu,
        down). A backend may override this for a kind it fuses."""
        from agentkv.hal.blocks import ffn_op

        return ffn_op(weights, self, x, spec)

    def moe_ffn(self, x: Tensor, weights: Any, spec: Any) -> Tensor:
        """A mixture-of-experts FFN (`hal.blocks.MoEFFN`, `MoEFFNSpec`) on its normed input
        `x` `[n, d]` -> `[n, d]`: route each token to its top-k experts, run them, sum their
        outputs weighted by the router in the token's own top-k order, add the shared expert.
        A token's bits never depend on which other tokens share the call."""
        raise NotImplementedError(f"{self.name}: moe_ffn")

    def decoder_blocks(
        self, h: Tensor, x: Tensor, layers: Sequence[DecoderLayer], specs: Sequence[BlockSpec], meta: AttnMeta,
        kv: Any, final_norm: Weight,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """Every decoder block in order (`decoder_block` each): block i ends in block i+1's
        attention norm, the last in `final_norm`. -> (h, the final norm's output)."""
        from agentkv.hal.blocks import next_norms

        for i, (layer, next_norm) in enumerate(zip(layers, next_norms(layers, final_norm))):
            h, x = self.decoder_block(h, x, layer, specs[i], meta, kv, i, next_norm)
        return h, x

    def decoder_block(
        self,
        h: Tensor,
        x: Tensor,
        layer: DecoderLayer,
        spec: BlockSpec,
        meta: AttnMeta,
        kv: Any,
        index: int,
        next_norm: Weight,
    ) -> tuple[Tensor, Tensor]:
        """One decoder block on the residual `h` `[n, d]` and its normed input `x` `[n, d]`:

            x -> qkv -> attention_inputs -> attention -> o;  h, x = add_norm(h, ., ffn.norm)
            x -> ffn(x, layer.ffn, spec.ffn);                h, x = add_norm(h, ., next_norm)

        with the layer's post norms (`attention.post_norm`, `ffn.post_norm`, gemma3) inside the
        add_norms when it has them; the FFN is whatever kind `layer.ffn` is (`Backend.ffn`).
        `next_norm` is the next block's attention norm, or the final norm. Stores this block's
        K/V (mutates kv) and may reuse h's storage. -> (h, the next norm's output)."""
        from agentkv.hal.blocks import project

        att, a = layer.attention, spec.attention
        q = self.attention_inputs(project(self, x, att.qkv), meta, kv, index, a, att.q_norm, att.k_norm)
        out = self.attention(q, kv, index, meta, a.scale, window=a.window)
        o = self.matmul(self.reshape(out, (q.shape[0], a.num_heads * a.head_dim)), att.o)
        h, x = self.add_norm(h, o, layer.ffn.norm, a.eps, a.unit_offset, post_weight=att.post_norm)
        return self.add_norm(
            h,
            self.ffn(x, layer.ffn, spec.ffn),
            next_norm,
            a.eps,
            a.unit_offset,
            post_weight=getattr(layer.ffn, "post_norm", None),
        )

    @abstractmethod
    def add(self, a: Tensor, b: Tensor) -> Tensor: ...

    @abstractmethod
    def scale(self, x: Tensor, factor: float) -> Tensor: ...

    @abstractmethod
    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """`cap * tanh(x / cap)`."""

    # -- KV and attention -----------------------------------------------------------------
    @abstractmethod
    def allocate_kv(self, spec: KVSpec) -> Any:
        """A zeroed paged KV store of `spec.dtype` elements (which must be `kv_dtype`:
        `check_kv_spec`); an opaque handle passed back to the ops below."""

    @abstractmethod
    def kv_store(self, kv: Any, layer: int, k: Tensor, v: Tensor, slot_mapping: np.ndarray) -> None:
        """Write `[n, kvh, hd]` K and V rows into their slots (mutates kv); an f16 store rounds
        them to nearest even (numpy's and torch's cast), and attention reads those values."""

    @abstractmethod
    def copy_blocks(self, kv: Any, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy each (src, dst) block across every layer (mutates kv)."""

    def read_block(self, kv: Any, block: int) -> bytes:
        """A copy of one KV block across every layer, for the disk tier: little-endian elements
        of the store's dtype `[num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]` (a fence)."""
        raise NotImplementedError(f"{self.name}: read_block")

    def write_block(self, kv: Any, block: int, data: bytes) -> None:
        """Overwrite one KV block with bytes laid out as `read_block` returns them (mutates kv;
        `write_block(kv, b, read_block(kv, b))` leaves every bit as it was)."""
        raise NotImplementedError(f"{self.name}: write_block")

    def lora_add(self, x: Tensor, y: Tensor, row_slots: np.ndarray, pieces: Sequence[Any]) -> Tensor:
        """y `[n, m]` += row i's LoRA deltas, in place and blind to other rows (hal/lora.py). -> y"""
        raise NotImplementedError(f"{self.name}: lora_add")

    @abstractmethod
    def attention(
        self,
        q: Tensor,
        kv: Any,
        layer: int,
        meta: AttnMeta,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        """Causal attention of `[n, h, hd]` queries over each sequence's paged K/V (which
        already holds this step's rows). GQA when h > kvh. `window` keeps only the last
        `window` positions (key pos > query pos - window). -> `[n, h, hd]`."""

    def sparse_latent_attention(self, q_abs, q_index, head_w, kv, layer, meta, spec, ispec) -> np.ndarray:
        """DeepSeek sparse attention of q_abs `[n, h, L]`, q_index `[n, H, D]`, head_w `[n, H]`
        over layer `layer`'s latent rows -> `[n, h, kv_rank]` f32 (hal/mla_sparse.py; default:
        `attend_sparse`, numpy on the host). `spec`: an MLASpec, `ispec` an IndexerSpec."""
        from agentkv.hal.mla_sparse import attend_sparse, host_array, latent_store

        return attend_sparse(*map(host_array, (q_abs, q_index, head_w)), latent_store(kv, layer), meta, spec, ispec)

    @abstractmethod
    def attention_dense(self, q: Tensor, k: Tensor, v: Tensor, seq_lens: tuple[int, ...], scale: float) -> Tensor:
        """Bidirectional attention within each sequence (encoders), no cache.
        q/k/v `[n, h, hd]`, rows grouped by sequence."""
