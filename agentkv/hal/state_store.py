"""The recurrent state of hybrid models: slots, snapshots, and where a chunk reads and writes them.

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

import numpy as np

STATE_DTYPE = np.float32


class StateStore:
    """Per recurrent layer, a conv state and a recurrent state per slot (= KV block id), f32,
    allocated when a slot is first written and dropped by `release` / `_drop`. Owned by the
    model runner; the cache counts the slots through the blocks. `specs`: one per layer,
    anything with `conv_shape`, `recurrent_shape` and `state_bytes` (`DeltaNetSpec`,
    `hal.mamba.Mamba2Spec`); `every`: which full blocks keep a snapshot (module docstring)."""

    def __init__(self, specs: Sequence, num_slots: int, block_size: int, every: int = 1):
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
