"""Runs a snippet in a fresh interpreter: what a process does before its first kernel call,
or without a compiler, can only be seen in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` from the repository root with `env` added; raises if it fails."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr
    return r
