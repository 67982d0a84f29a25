"""Rotary-embedding frequency tables (numpy, float64 then rounded once to float32).

Every backend gathers rows of the same tables, so a position's cos/sin never depends on
the batch. Scaling rules follow HF transformers' `modeling_rope_utils`."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from agentkv.hal.base import RopeSpec


def inv_freq(spec: RopeSpec) -> tuple[np.ndarray, float]:
    """Per-pair inverse frequencies `[dim/2]` and the attention scaling factor (yarn's mscale)."""
    base = spec.theta ** (np.arange(0, spec.dim, 2, dtype=np.float64) / spec.dim)
    freqs = 1.0 / base
    sc = spec.scaling_dict
    kind = sc.get("type") or sc.get("rope_type") or "default"
    factor = float(sc.get("factor", 1.0))
    if kind in ("default", "none"):
        return freqs, 1.0
    if kind == "factors":  # llama.cpp's rope_freqs.weight: per-pair divisors of the frequency
        return freqs / np.asarray(sc["factors"], dtype=np.float64), 1.0
    if kind == "linear":
        return freqs / factor, 1.0
    if kind == "llama3":
        return _llama3(freqs, sc, factor), 1.0
    if kind == "yarn":
        return _yarn(freqs, sc, factor, spec.dim, spec.theta)
    raise ValueError(f"rope scaling type {kind!r} is not supported (linear, llama3, yarn)")


def _llama3(freqs: np.ndarray, sc: dict, factor: float) -> np.ndarray:
    low = float(sc.get("low_freq_factor", 1.0))
    high = float(sc.get("high_freq_factor", 4.0))
    old_len = float(sc.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / freqs
    out = np.where(wavelen > low_wavelen, freqs / factor, freqs)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, out)


def _yarn(freqs: np.ndarray, sc: dict, factor: float, dim: int, base: float):
    old_len = float(sc.get("original_max_position_embeddings", sc.get("original_context_length", 4096)))
    beta_fast, beta_slow = float(sc.get("beta_fast", 32)), float(sc.get("beta_slow", 1))

    def correction_dim(num_rot: float) -> float:
        return (dim * math.log(old_len / (num_rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if sc.get("truncate", True):  # gpt-oss's HF config keeps the fractional bounds (truncate: false)
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    out = freqs / factor * (1 - extrapolation) + freqs * extrapolation
    mscale = float(sc.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0))
    return out, mscale


@lru_cache(maxsize=16)
def _tables(spec: RopeSpec, num_pos: int) -> tuple[np.ndarray, np.ndarray]:
    freqs, mscale = inv_freq(spec)
    angles = np.arange(num_pos, dtype=np.float64)[:, None] * freqs[None, :]
    return ((np.cos(angles) * mscale).astype(np.float32), (np.sin(angles) * mscale).astype(np.float32))


def rope_tables(spec: RopeSpec, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[num_pos, dim/2]` float32 covering positions 0..max_pos (grown in powers of 2)."""
    num_pos = 1 << max(12, int(max_pos).bit_length())
    return _tables(spec, num_pos)
