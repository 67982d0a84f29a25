"""Recurrent state of hybrid models (gated DeltaNet layers): the state slots and the op that
runs the causal conv and the gated delta rule over them, in one fixed order.

Exactness: the recurrence runs one token at a time, each token's arithmetic on arrays of
fixed shapes, so the state after position p has the same bits whether p was reached in one
prefill, in chunks cut anywhere, in a batch or after a resume from a snapshot. Every backend
runs this numpy code on host copies of its tensors (the op's only fences).

State slots are keyed by KV block id and allocated when written. Slot b holds, per recurrent
layer, the state after the last position of block b its owner computed:

    bs = 4     positions:  0 1 2 3 | 4 5 6 7 | 8 9
    blocks:                  b0    |   b1    | b2 (partial, its owner's live state)
    slot b0 = state after 3 (a snapshot), slot b1 = after 7, slot b2 = after 9

A full block is never written again (a request writes only past its cached_len, into blocks
it owns alone), so a full block's slot is the snapshot at its end, held and freed with the
block by the radix node that lists it (`release`, when the block returns to the pool). A
chunk starting at p > 0 reads slot `table[(p - 1) // bs]`.

Which full blocks keep a snapshot (`StateStore.every`, the knob `snapshot_every`): every
`every`-th block of a sequence (block j with (j + 1) % every == 0) and the last block end a
prefill chunk passes (where a prompt stops: the next turn of an agent resumes there) for good;
and, while a sequence decodes, the latest block end it passed ("transient": superseded by the
next one, dropped after the step that supersedes it; when the sequence ends, it stays, so a
next turn that sends the whole transcript back resumes at most a block before its end). Any
other state is the sequence's running state, in the block of its last computed token, dropped
when the sequence ends. `every` = 1 keeps every block end; a snapshot costs `bytes_per_slot`,
so `every` trades how deep a hit may resume for memory (`snapshots` lists the slots holding
one; a hit resumes from the deepest of them).

Speculation: a verification chunk (a decode row and its draft) records the state after each
of its rows; once the engine knows how many were accepted, the state after the last accepted
token is written back into that position's slot (`settle`), so a rejected draft leaves the
state exactly as if it had never been tried. A block end among the rejected positions lies
past the sequence's computed tokens, so no hit ever resumes from it before the accepted
tokens reach it and write it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, Tensor

STATE_DTYPE = np.float32


@dataclass(frozen=True, slots=True)
class DeltaNetSpec:
    """Shapes of one gated DeltaNet layer and how its projections come:

        layout "flat":  [q|k|v, z, b, a]                  (qwen3_5, GGUF qwen35)
        layout "ba":    [q|k|v, z, ba grouped by key head] (GGUF qwen3next)
        layout "qkvz":  [qkvz grouped by key head, ba grouped by key head] (HF qwen3_next)

    Value head j reads key head j // (num_v / num_k) (HF's interleaved repeat), or with
    `tiled` key head j % num_k (llama.cpp's converter reorders qwen35's value heads so)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float
    layout: str = "flat"
    tiled: bool = False

    def __post_init__(self):
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DeltaNetSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.layout not in ("flat", "ba", "qkvz"):
            raise ValueError(f"DeltaNetSpec.layout={self.layout!r}: use 'flat', 'ba' or 'qkvz'")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"DeltaNetSpec.num_v_heads={self.num_v_heads} must be a multiple of num_k_heads={self.num_k_heads}"
            )

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_dim)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def state_bytes(self) -> int:
        """Conv state plus recurrent state of one slot, f32."""
        return 4 * (int(np.prod(self.conv_shape)) + int(np.prod(self.recurrent_shape)))


@dataclass(frozen=True, slots=True)
class DeltaNetWeights:
    """Host arrays of one layer's small parameters: the depthwise conv `[conv_dim, kernel]`,
    the decay `a_neg` = -exp(A_log) `[num_v_heads]`, `dt_bias` `[num_v_heads]` and the gated
    norm's gain `[head_v_dim]`."""

    conv: np.ndarray
    a_neg: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray


class StateStore:
    """Per recurrent layer, a conv state and a recurrent state per slot (= KV block id), f32,
    allocated when a slot is first written and dropped by `release` / `_drop`. Owned by the
    model runner; the cache counts the slots through the blocks. `specs`: one per layer,
    anything with `conv_shape`, `recurrent_shape` and `state_bytes` (`DeltaNetSpec`,
    `hal.mamba.Mamba2Spec`); `every`: which full blocks keep a snapshot (module docstring)."""

    def __init__(self, specs: Sequence[DeltaNetSpec], num_slots: int, block_size: int, every: int = 1):
        if num_slots < 1 or block_size < 1 or every < 1:
            raise ValueError(f"num_slots={num_slots}, block_size={block_size} and every={every} must be >= 1")
        self.specs, self.num_slots, self.block_size, self.every = tuple(specs), num_slots, block_size, every
        self.conv: list[dict[int, np.ndarray]] = [{} for _ in self.specs]
        self.recurrent: list[dict[int, np.ndarray]] = [{} for _ in self.specs]
        self.snapshots: set[int] = set()  # slots whose state stays once their block is full
        self.transient: set[int] = set()  # snapshots that are a decoding sequence's latest block end
        self.superseded: set[int] = set()  # transient snapshots to drop once this step is done
        # This step's verification chunks: chunk index -> per row, per layer (conv, rec).
        self.recording: dict[int, list[list]] = {}

    def begin_step(self, chunks: Sequence) -> None:
        """Before a forward over `chunks` (the runner's `Chunk`s; mutates): its verification
        chunks (`chunk.draft`) will record the state after each of their rows."""
        self.recording = {
            i: [[None] * len(self.specs) for _ in c.token_ids]
            for i, c in enumerate(chunks)
            if getattr(c, "draft", False)
        }

    def end_step(self) -> None:
        """After a forward (mutates): drop the transient snapshots it superseded. Never during
        the forward, where a sequence admitted this step may still read one."""
        for slot in self.superseded:
            if slot in self.transient:
                self.release(slot)
        self.superseded = set()

    def settle(self, chunks: Sequence, num_computed: Sequence[int]) -> None:
        """After the step's verification (mutates): each verification chunk's sequence now has
        `num_computed` tokens; the state after the last of them goes into that position's
        slot, so a rejected draft leaves no trace. Drops the records."""
        bs = self.block_size
        for i, states in self.recording.items():
            chunk, last = chunks[i], num_computed[i] - 1
            if chunk.start_pos <= last < chunk.start_pos + len(states):
                self._write(chunk.block_table[last // bs], states[last - chunk.start_pos])
        self.recording = {}

    def _write(self, slot: int, states: list) -> None:
        for layer, (conv, rec) in enumerate(states):
            self.conv[layer][slot], self.recurrent[layer][slot] = conv, rec

    def keeps(self, block_index: int) -> bool:
        """Whether the `block_index`-th block of a sequence keeps its end state (every
        `every`-th; a prefill chunk's last block end is kept too, see `keep_state`)."""
        return (block_index + 1) % self.every == 0

    def has(self, slot: int) -> bool:
        """Whether slot `slot` holds a snapshot a hit may resume from."""
        return slot in self.snapshots

    def release(self, slot: int) -> None:
        """Block `slot` went back to the pool: its state goes (mutates)."""
        self.snapshots.discard(slot)
        self.transient.discard(slot)
        for layer in range(len(self.specs)):
            self._drop(layer, slot)

    def release_running(self, table: Sequence[int], num_computed: int) -> None:
        """A sequence with block table `table` left with `num_computed` tokens computed
        (mutates): the running state in its last token's block goes unless that block keeps a
        snapshot, and its latest block end stays a snapshot for good."""
        last = table[(num_computed - 1) // self.block_size]
        if last not in self.snapshots:
            self.release(last)
        if num_computed >= self.block_size:
            self.transient.discard(table[num_computed // self.block_size - 1])

    def _drop(self, layer: int, slot: int) -> None:
        self.conv[layer].pop(slot, None)
        self.recurrent[layer].pop(slot, None)

    @property
    def bytes_per_slot(self) -> int:
        return sum(s.state_bytes for s in self.specs)

    @property
    def bytes_held(self) -> int:
        """Bytes of the states held now (snapshots and running states)."""
        return sum(a.nbytes for layer in (*self.conv, *self.recurrent) for a in layer.values())

    def copy(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy each (src, dst) slot across every layer, a snapshot staying one (mutates)."""
        for src, dst in pairs:
            for arrays in (self.conv, self.recurrent):
                for a in arrays:
                    if src in a:
                        a[dst] = a[src].copy()
            if src in self.snapshots:
                self.snapshots.add(dst)

    def read_slot(self, slot: int) -> bytes:
        """Slot `slot` of every layer, conv then recurrent state per layer, little-endian f32,
        then one byte: 1 for a snapshot, 0 (and zeros for the states) for a slot without one."""
        if slot not in self.snapshots:
            return bytes(self.bytes_per_slot + 1)
        return b"".join(a[slot].tobytes() for c, r in zip(self.conv, self.recurrent) for a in (c, r)) + b"\x01"

    def write_slot(self, slot: int, data: bytes) -> None:
        """Put back a slot as `read_slot` gave it (mutates): its states and whether it is a
        snapshot; a slot read without one is left empty."""
        if len(data) != self.bytes_per_slot + 1:
            raise ValueError(f"state slot payload has {len(data)} bytes, expected {self.bytes_per_slot + 1}")
        self.release(slot)
        if data[-1] != 1:
            return
        offset = 0
        for layer, spec in enumerate(self.specs):
            for arrays, shape in ((self.conv, spec.conv_shape), (self.recurrent, spec.recurrent_shape)):
                size = 4 * int(np.prod(shape))
                arrays[layer][slot] = np.frombuffer(data, STATE_DTYPE, size // 4, offset).reshape(shape).copy()
                offset += size
        self.snapshots.add(slot)


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _l2norm(x: np.ndarray) -> np.ndarray:
    """FLA's l2norm over the last dim: x / sqrt(sum(x^2) + 1e-6)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))


def _split_projections(host: list[np.ndarray], spec: DeltaNetSpec) -> tuple[np.ndarray, ...]:
    """(qkv `[n, conv_dim]` as q|k|v, z `[n, value_dim]`, b, a `[n, num_v_heads]`) from the
    projections in `spec.layout`."""
    if spec.layout == "flat":
        return tuple(host)
    n, hk, dk = host[0].shape[0], spec.num_k_heads, spec.head_k_dim
    r = spec.num_v_heads // hk
    ba = host[-1].reshape(n, hk, 2 * r)
    b, a = ba[..., :r].reshape(n, -1), ba[..., r:].reshape(n, -1)
    if spec.layout == "ba":
        return host[0], host[1], b, a
    qkvz = host[0]
    g = qkvz.reshape(n, hk, 2 * dk + 2 * r * spec.head_v_dim)
    q, k = g[..., :dk], g[..., dk : 2 * dk]
    v, z = g[..., 2 * dk : 2 * dk + r * spec.head_v_dim], g[..., 2 * dk + r * spec.head_v_dim :]
    qkv = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], axis=1)
    return qkv, z.reshape(n, -1), b, a


def delta_net(
    be: Backend,
    projections: list[Tensor],
    weights: DeltaNetWeights,
    spec: DeltaNetSpec,
    store: StateStore,
    layer: int,
    meta: AttnMeta,
) -> Tensor:
    """The gated DeltaNet mixer between the input projections and the output projection:
    conv (rolling state) + silu, q/k L2 norm, the gated delta rule, the gated RMSNorm.
    `projections`: see `_split_projections`. Reads and writes the sequences' state slots in
    `store` layer `layer` (mutates). -> `[n, value_dim]`."""
    qkv, z, b, a = _split_projections([be.read(t) for t in projections], spec)
    beta = _sigmoid(b)
    g = weights.a_neg * _softplus(a + weights.dt_bias)  # [n, Hv]
    out = np.empty((qkv.shape[0], spec.num_v_heads, spec.head_v_dim), np.float32)
    spans = zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables)
    for i, (start_row, num, ctx, table) in enumerate(spans):
        rows = slice(start_row, start_row + num)
        out[rows] = _sequence(be, (qkv[rows], g[rows], beta[rows]), ctx - num, (table, i), weights, spec, store, layer)
    y = out * (np.float32(1) / np.sqrt((out * out).mean(-1, keepdims=True) + np.float32(spec.eps)))
    z = z.reshape(out.shape)
    y = (weights.norm * y) * (z * _sigmoid(z))
    return be.upload(np.ascontiguousarray(y.reshape(out.shape[0], spec.value_dim), np.float32))


def _sequence(be, rows, start, where, weights, spec, store, layer) -> np.ndarray:
    """One sequence's rows `(qkv, g, beta)` at positions [start, start + len(qkv)), the delta
    rule on `be` (`where`: its block table and chunk index): returns its core outputs `[len, Hv, dv]` and leaves the
    state after each block end it passes, and after its last row, in the slot of that
    position's block; a verification chunk also records the state after every row."""
    qkv, g, beta = rows
    table, index = where
    record = store.recording.get(index)
    kernel = spec.conv_kernel
    conv_state, rec = resume_state(store, layer, table, start, copy=False)
    # A running state (no snapshot) is this sequence's alone and superseded by this chunk's.
    inplace = start == 0 or table[(start - 1) // store.block_size] not in store.snapshots
    num = qkv.shape[0]
    window = np.concatenate([conv_state, qkv], axis=0)  # [K - 1 + num, C]
    conv = window[0:num] * weights.conv[:, 0]
    for tap in range(1, kernel):  # taps summed in one fixed order
        conv = conv + window[tap : tap + num] * weights.conv[:, tap]
    conv = conv * _sigmoid(conv)
    kd = spec.key_dim
    r = spec.num_v_heads // spec.num_k_heads
    heads = (lambda x: np.tile(x, (1, r, 1))) if spec.tiled else (lambda x: x.repeat(r, axis=1))
    q = heads(_l2norm(conv[:, :kd].reshape(num, spec.num_k_heads, spec.head_k_dim)))
    k = heads(_l2norm(conv[:, kd : 2 * kd].reshape(num, spec.num_k_heads, spec.head_k_dim)))
    q = q * np.float32(1.0 / np.sqrt(spec.head_k_dim))
    v = np.ascontiguousarray(conv[:, 2 * kd :].reshape(num, spec.num_v_heads, spec.head_v_dim))
    where_state = (layer, table, record)
    rows = state_rows(store, record, start, num)
    out, states = be.delta_rule(q, k, v, np.exp(g), beta, rec, rows, inplace)
    for t, state in zip(rows, states):
        keep_state(store, where_state, (start, t, num), window[t + 1 : t + kernel], state)
    return out


def delta_rule_reference(q, k, v, decay, beta, state, rows) -> tuple[np.ndarray, list[np.ndarray]]:
    """The gated delta rule in numpy, one row at a time (`Backend.delta_rule`'s default):
    `S = decay S; kv = S^T k; S += k (beta (v - kv))^T; o = S^T q` per value head."""
    out = np.empty(v.shape, np.float32)
    wanted, kept = set(rows), []
    for t in range(v.shape[0]):
        state = state * decay[t][:, None, None]
        kv_mem = (state * k[t][:, :, None]).sum(axis=1)  # [Hv, dv]
        delta = (v[t] - kv_mem) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = (state * q[t][:, :, None]).sum(axis=1)
        if t in wanted:
            kept.append(state)
    return out, kept


def resume_state(
    store: StateStore, layer: int, table: Sequence[int], start: int, copy: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(conv state, recurrent state) before position `start` of the sequence with block table
    `table` in `store` layer `layer`: zeros at 0, else the slot of the block holding position
    `start - 1` (copies unless `copy` is False: then the caller must not write them)."""
    if start == 0:
        spec = store.specs[layer]
        return np.zeros(spec.conv_shape, STATE_DTYPE), np.zeros(spec.recurrent_shape, STATE_DTYPE)
    slot = table[(start - 1) // store.block_size]
    if slot not in store.recurrent[layer]:
        raise RuntimeError(f"no state in slot {slot} (layer {layer}) to resume position {start} from: bug")
    conv, rec = store.conv[layer][slot], store.recurrent[layer][slot]
    return (conv.copy(), rec.copy()) if copy else (conv, rec)


def state_rows(store: StateStore, record: list | None, start: int, num: int) -> list[int]:
    """The rows t of a chunk of `num` rows at position `start` after which `keep_state` needs
    the state: every row of a verification chunk (`record`), else the block ends that keep a
    snapshot and the last row."""
    if record is not None:
        return list(range(num))
    return [t for t in range(num) if t == num - 1 or _keeps_snapshot(store, start, start + t, num)]


def _keeps_snapshot(store: StateStore, start: int, pos: int, num: int) -> bool:
    """Whether the state after position `pos` of a (non-verification) chunk of `num` rows at
    `start` is a snapshot: a block end that `store.keeps`, or a prefill chunk's last block end."""
    bs = store.block_size
    return (pos + 1) % bs == 0 and (store.keeps(pos // bs) or (num > 1 and pos + bs >= start + num))


def keep_state(store: StateStore, where: tuple, row: tuple[int, int, int], conv: np.ndarray, rec: np.ndarray) -> None:
    """After row t of a chunk of `num` rows starting at position `start` (`row`), with `where`
    = (layer, block table, the chunk's record or None; mutates): a verification chunk records
    the state; a block end that keeps a snapshot (StateStore docstring: every k-th, a prefill
    chunk's last, a decode step's as transient) and the chunk's last row write it into that
    position's block's slot; a decode step's block end supersedes the transient one before it."""
    layer, table, record = where
    start, t, num = row
    if record is not None:
        record[t][layer] = (conv.copy(), rec)
    bs, pos = store.block_size, start + t
    block_end, last, j = (pos + 1) % bs == 0, t == num - 1, pos // bs
    if record is not None:  # a verification chunk: settle writes the accepted state
        snapshot, transient = block_end and store.keeps(j), False
    else:
        snapshot = _keeps_snapshot(store, start, pos, num)
        transient = block_end and not snapshot and num == 1
    if not (snapshot or transient or last):
        return
    slot = table[j]
    store.recurrent[layer][slot], store.conv[layer][slot] = rec, conv.copy()  # not a view of the chunk
    if snapshot or transient:
        store.snapshots.add(slot)
        if transient:
            store.transient.add(slot)
        if record is None and j > 0 and table[j - 1] in store.transient:
            store.superseded.add(table[j - 1])
    if last and start > 0:
        before = table[(start - 1) // bs]
        if before != slot and before not in store.snapshots:
            store._drop(layer, before)  # noqa: SLF001 - the store's own running-state rule


def gate_heads(be: Backend, x: Tensor, num_heads: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """Split a gated attention's query projection `[n, h * 2 hd]` (per head: query, gate) into
    (q `[n, h * hd]`, gate `[n, h * hd]`)."""
    host = be.read(x).reshape(-1, num_heads, 2 * head_dim)
    n = host.shape[0]
    q = np.ascontiguousarray(host[..., :head_dim].reshape(n, -1))
    return be.upload(q), be.upload(np.ascontiguousarray(host[..., head_dim:].reshape(n, -1)))


def sigmoid_gate(be: Backend, x: Tensor, gate: Tensor) -> Tensor:
    """`x * sigmoid(gate)`, both `[n, m]` (the gated attention's output gate)."""
    return be.upload(be.read(x) * _sigmoid(be.read(gate)))
