"""The recurrent layers' ops of the compute contract (gated DeltaNet), with their numpy defaults.

`Backend` inherits them; a backend overrides the ones it has kernels for. They take and return
host arrays: the recurrent state lives on the host (hal/state_store.py). A row's results may
depend only on its inputs and the state before it, never on the other rows of the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class RecurrentOps:
    """The gated DeltaNet ops (hal/recurrent.py runs the layer with them)."""

    def delta_rule(self, q, k, v, decay, beta, state, rows: Sequence[int], inplace=False) -> tuple[Any, list]:
        """The gated delta rule over one sequence's rows: q, k `[n, Hv, dk]`, v `[n, Hv, dv]`,
        decay, beta `[n, Hv]`, the state before row 0 `[Hv, dk, dv]` -> (o `[n, Hv, dv]`, the
        states after each of the ascending `rows`). `state` is never written unless `inplace`
        (the caller no longer needs it), where a backend may update it into the state after
        the last row. Default: numpy, one row at a time (never in place)."""
        from agentkv.hal.recurrent import delta_rule_reference

        return delta_rule_reference(q, k, v, decay, beta, state, rows)

    def delta_net_inputs(self, window: np.ndarray, conv_w: np.ndarray, spec: Any) -> tuple[np.ndarray, ...]:
        """The delta rule's inputs from q|k|v rows (default: hal/recurrent.py
        `delta_net_inputs_reference`): `window` `[K - 1 + n, C]` (the conv state, then the rows),
        `conv_w` `[C, K]`, `spec` a DeltaNetSpec -> (q, k `[n, Hv, dk]`, v `[n, Hv, dv]`)."""
        from agentkv.hal.recurrent import delta_net_inputs_reference

        return delta_net_inputs_reference(window, conv_w, spec)

    def gated_rms_norm(self, out: np.ndarray, z: np.ndarray, norm: np.ndarray, eps: float) -> np.ndarray:
        """The gated RMSNorm after the delta rule (default: hal/recurrent.py
        `gated_rms_norm_reference`): out `[n, H, dv]`, z `[n, H * dv]` -> `[n, H * dv]`."""
        from agentkv.hal.recurrent import gated_rms_norm_reference

        return gated_rms_norm_reference(out, z, norm, eps)

    def delta_net_decode(self, rows: tuple, weights: Any, spec: Any, states: Sequence[tuple]) -> tuple:
        """A decode step of n sequences of one row each: `rows` = (qkv `[n, C]`, z `[n, Hv * dv]`,
        decay, beta `[n, Hv]`), `weights` a DeltaNetWeights, `states[i]` = (conv `[K - 1, C]`,
        recurrent `[Hv, dk, dv]`) before row i; the recurrent state is updated in place into the
        one after the row (the caller passes arrays it owns). -> (y `[n, Hv * dv]`, the conv
        states after the rows, `[K - 1, C]` each). Row i has the bits the three ops above give
        it (the default calls them); a backend may fuse them, never change them."""
        qkv, z, decay, beta = rows
        outs, convs = [], []
        for i, (conv, rec) in enumerate(states):
            window = np.concatenate([conv, qkv[i : i + 1]], axis=0)
            q, k, v = self.delta_net_inputs(window, weights.conv, spec)
            out, (after,) = self.delta_rule(q, k, v, decay[i : i + 1], beta[i : i + 1], rec, [0], inplace=True)
            rec[...] = after  # a no-op where delta_rule updated it in place
            outs.append(out)
            convs.append(window[1:])
        shape = (0, spec.num_v_heads, spec.head_v_dim)
        out = np.concatenate(outs) if outs else np.empty(shape, np.float32)
        return self.gated_rms_norm(out, z, weights.norm, spec.eps), convs
