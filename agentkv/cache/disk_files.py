"""The disk tier's files on the file system: where each block lives, who may read it, the
index rebuilt from names alone, and what another process or fingerprint left there.

    DIR/kv-v<layout>-<fingerprint[:16]>/        0700, one per engine fingerprint
        g-<group[:16]>/                         0700, one per group (a tenant): flushed whole
            <key>.kvb                           0600, written as .<key>.<pid>.tmp, then renamed

Only the owner can read the files (they hold KV, which reveals the prompt). A temporary file
is removed at start only when the process that named it is gone, so two engines sharing a
folder never delete each other's writes in flight. Files under another fingerprint are
counted (they are never served: their keys chain from another root) and left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from agentkv.cache.disk_fingerprint import LAYOUT_VERSION
from agentkv.cache.disk_format import SUFFIX

log = logging.getLogger(__name__)
DIR_MODE = 0o700
FILE_MODE = 0o600


class Found(NamedTuple):
    """What a scan of the tier's folder found."""

    index: OrderedDict[str, tuple[str, int]]  # key -> (group, bytes), oldest first
    num_stale_tmp: int  # temporary files of dead writers, removed
    num_other_fingerprint: int  # files under another fingerprint's folder, left alone


def make_dir(path: Path) -> Path:
    """`path` (and its parents) as a folder only the owner can enter."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def tier_dir(root: Path, fp_hex: str) -> Path:
    return Path(root) / f"kv-v{LAYOUT_VERSION}-{fp_hex[:16]}"


def block_path(tier: Path, group: str, key: str) -> Path:
    return tier / f"g-{group[:16]}" / f"{key}{SUFFIX}"


def _writer_alive(name: str) -> bool:
    """Whether the process a temporary file `.<key>.<pid>.tmp` names is still running."""
    try:
        pid = int(name.rsplit(".", 2)[-2])
    except (ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def scan(tier: Path) -> Found:
    """The index of `tier` from names and mtimes alone (no file is read), oldest first."""
    found, num_stale = [], 0
    for group_dir in (p for p in tier.iterdir() if p.is_dir() and p.name.startswith("g-")):
        with os.scandir(group_dir) as entries:
            for entry in entries:
                stem, suffix = os.path.splitext(entry.name)
                if suffix == SUFFIX and len(stem) == 64 and entry.is_file():
                    st = entry.stat()
                    found.append((st.st_mtime_ns, stem, group_dir.name[2:], st.st_size))
                elif entry.name.endswith(".tmp") and not _writer_alive(entry.name):
                    num_stale += 1
                    unlink(Path(entry.path))
    index = OrderedDict((stem, (group, size)) for _, stem, group, size in sorted(found))
    return Found(index, num_stale, _count_others(tier))


def _count_others(tier: Path) -> int:
    """Block files in the sibling folders of other fingerprints or layouts."""
    count = 0
    for other in tier.parent.glob("kv-v*-*"):
        if other != tier and other.is_dir():
            count += sum(1 for _ in other.rglob(f"*{SUFFIX}"))
    if count:
        log.info("KV disk tier: %d files under other fingerprints in %s are not served", count, tier.parent)
    return count


def write_file(path: Path, data: bytes) -> None:
    """Temporary file (owner-only), then rename: a reader (or a restart after kill -9) sees
    the whole file or none of it. Raises OSError."""
    make_dir(path.parent)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s: %s", path, exc)


def remove_group(tier: Path, group: str | None) -> None:
    """Delete one group's folder (None: every group's) with all its files."""
    targets = [tier / f"g-{group[:16]}"] if group is not None else [p for p in tier.glob("g-*") if p.is_dir()]
    for target in targets:
        shutil.rmtree(target, ignore_errors=True)
