"""Block keys and block files of the disk tier: the chained hash over explicit bytes and the
self-describing, checksummed file format.

Keys. A chain starts at a root salted with the fingerprint and the namespace, and each full
block extends it with its token ids as little-endian int32:

    root   = SHA-256(b"agentkv-kv\\0" | fingerprint digest (32 bytes) | namespace as JSON)
    h[j]   = SHA-256(h[j-1] | int32le(tokens[j*bs : (j+1)*bs]))        h[-1] = root

so a block's key names its whole prefix, under one fingerprint and one namespace.

File. One block per file, named `<h[j] hex>.kvb`:

    | MAGIC (4) | header length u32le | header (JSON) | payload | SHA-256 of all before (32) |

The header states the layout version, fingerprint, key, the SHA-256 of the namespace and of
the block's token ids (never the tenant, salt or tokens themselves), payload shape
`[num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]`, dtype and payload length.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Hashable, Sequence
from typing import NamedTuple

MAGIC = b"AKVB"
SUFFIX = ".kvb"
_HEAD = struct.Struct("<4sI")
_DIGEST_LEN = 32


class BlockHeader(NamedTuple):
    layout_version: int
    fingerprint: str  # hex
    key: str  # hex h[j]
    namespace: str  # hex SHA-256 of the namespace's JSON text
    tokens: str  # hex SHA-256 of the block's token ids as int32le
    shape: tuple[int, ...]
    dtype: str
    payload_bytes: int


IGNORE_REASONS = ("truncated", "corrupt", "layout", "fingerprint", "mismatch")


class BadBlockFile(ValueError):
    """A block file that must not be served; the message says what was wrong and `reason`
    (one of IGNORE_REASONS) names the kind: cut short, damaged bytes, an older layout
    version, another fingerprint, or another block (key, namespace, tokens, shape, dtype)."""

    def __init__(self, message: str, reason: str) -> None:
        if reason not in IGNORE_REASONS:
            raise ValueError(f"reason={reason!r} is not one of {IGNORE_REASONS}")
        super().__init__(message)
        self.reason = reason


def namespace_text(namespace: Hashable) -> str | None:
    """The namespace as canonical JSON, or None when it cannot be persisted: only str, int,
    bool, None and tuples of them are stable across processes (Python's hash() is not). A
    per-request namespace (prompt logprobs) is never worth persisting either."""

    def plain(value: object) -> bool:
        if isinstance(value, tuple):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (str, int, bool))

    if not plain(namespace):
        return None
    if isinstance(namespace, tuple) and "prompt-logprobs" in namespace:
        return None
    return json.dumps(namespace)


def digest_of(namespace: str, token_ids: Sequence[int]) -> tuple[str, str]:
    """The header's digests of a namespace's JSON text and of one block's token ids."""
    packed = struct.pack(f"<{len(token_ids)}i", *token_ids)
    return hashlib.sha256(namespace.encode()).hexdigest(), hashlib.sha256(packed).hexdigest()


def root_hash(fingerprint: str, namespace: str) -> bytes:
    return hashlib.sha256(b"agentkv-kv\0" + bytes.fromhex(fingerprint) + namespace.encode()).digest()


def block_hashes(root: bytes, token_ids: Sequence[int], block_size: int, num_blocks: int) -> list[bytes]:
    """h[0..num_blocks) of the chain from `root` (the caller ensures the blocks are full)."""
    if num_blocks * block_size > len(token_ids):
        raise ValueError(
            f"{num_blocks} blocks of {block_size} need {num_blocks * block_size} tokens, got {len(token_ids)}"
        )
    pack = struct.Struct(f"<{block_size}i").pack
    out, parent = [], root
    for j in range(num_blocks):
        parent = hashlib.sha256(parent + pack(*token_ids[j * block_size : (j + 1) * block_size])).digest()
        out.append(parent)
    return out


def encode_block(header: BlockHeader, payload: bytes) -> bytes:
    """The whole file's bytes for one block."""
    if len(payload) != header.payload_bytes:
        raise ValueError(f"payload has {len(payload)} bytes, header says {header.payload_bytes}")
    text = json.dumps(header._asdict()).encode()
    body = _HEAD.pack(MAGIC, len(text)) + text + payload
    return body + hashlib.sha256(body).digest()


def decode_block(data: bytes, expected: BlockHeader) -> bytes:
    """The payload of a block file if it is intact and is exactly the block `expected`
    describes (every header field equal); raises BadBlockFile otherwise."""
    if len(data) < _HEAD.size + _DIGEST_LEN:
        raise BadBlockFile(f"truncated: {len(data)} bytes", "truncated")
    magic, text_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BadBlockFile(f"bad magic {magic!r}", "corrupt")
    whole_len = _HEAD.size + text_len + expected.payload_bytes + _DIGEST_LEN
    if len(data) < whole_len:  # a file cut short (its own header says how long it should be)
        raise BadBlockFile(f"truncated: {len(data)} of {whole_len} bytes", "truncated")
    body, digest = data[:-_DIGEST_LEN], data[-_DIGEST_LEN:]
    if hashlib.sha256(body).digest() != digest:
        raise BadBlockFile("checksum mismatch (corrupt or truncated)", "corrupt")
    try:
        fields = json.loads(body[_HEAD.size : _HEAD.size + text_len])
        header = BlockHeader(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except (ValueError, TypeError) as exc:
        raise BadBlockFile(f"unreadable header: {exc}", "corrupt") from None
    for name, want in expected._asdict().items():
        got = getattr(header, name)
        if got != want:
            reason = {"layout_version": "layout", "fingerprint": "fingerprint"}.get(name, "mismatch")
            raise BadBlockFile(f"{name} is {str(got)[:80]}, expected {str(want)[:80]}", reason)
    payload = body[_HEAD.size + text_len :]
    if len(payload) != header.payload_bytes:
        raise BadBlockFile(f"payload has {len(payload)} bytes, header says {header.payload_bytes}", "corrupt")
    return payload
