"""Witness rows for attention with sinks (gpt-oss): `Backend.attention_sinks` on the cases of
`ops.attention_case`, with a learned logit per head that joins every row's softmax
denominator. The sink term is one more exp and add per (row, head) after the keys' own
softmax sums, so the f32 floor holds as for plain attention."""

from __future__ import annotations

import numpy as np

from agentkv.hal.base import Backend


class _WithSinks:
    """`be` whose `attention` is `attention_sinks` with the given per-head sinks `[h]`."""

    def __init__(self, be: Backend, sinks: np.ndarray):
        self._be, self._sinks = be, be.upload_weight("sinks", sinks.astype(np.float32), 0, sinks.shape)

    def __getattr__(self, name):
        return getattr(self._be, name)

    def attention(self, q, kv, layer, meta, scale, window=None, softcap=None):
        return self._be.attention_sinks(q, kv, layer, meta, scale, window, self._sinks, softcap)


def sinks_cases():
    """(op, shape, run(backend) -> output, floor, check_argmax) rows, as `ops.op_cases`."""
    from agentkv.witness.ops import COSINE_FLOOR_F32, attention_case

    cases = []
    for h, kvh, hd, lens, window in [
        (8, 4, 16, [50, 9], 8),  # a window shorter than the rows: the sink is in every row
        (9, 3, 64, [37, 600], None),  # rows past one 256-key range: the sink after the merge
        (4, 1, 32, [300], 128),  # gpt-oss's window across a range boundary
    ]:
        sinks = np.random.default_rng(h * hd).standard_normal(h) * 2.0

        def att(be, h=h, kvh=kvh, hd=hd, lens=lens, window=window, sinks=sinks):
            if not hasattr(be, "attention_sinks"):
                raise NotImplementedError(f"{be.name}: attention_sinks")
            return attention_case(_WithSinks(be, sinks), 7, (h, kvh, hd), lens, window, None)

        label = "attention_sinks" + (f"/window={window}" if window else "")
        cases.append((label, f"h={h},kvh={kvh},hd={hd},lens={lens}", att, COSINE_FLOOR_F32, False))
    return cases
