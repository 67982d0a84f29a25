"""Run one benchmark arm in a fresh interpreter, so its memory and threads are its own and a
time limit can end it (with what it started). A timeout is reported as skipped, a crash as an
error; neither is ever a result.

Worker entry:  python -m agentkv.bench.isolate MODULE:FUNCTION SPEC.json OUT.json
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def run_isolated(target: str, spec: dict, workdir: Path, tag: str, timeout_s: float | None = None) -> dict:
    """`MODULE:FUNCTION(spec)` in a subprocess; its JSON result, {"skipped": ...} when it ran
    past `timeout_s`, or {"error": ...} when it failed. Spec and result stay in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "agentkv.bench.isolate", target, str(spec_path), str(out_path)]
    # Own session, so a timeout also ends what the arm started (the HTTP arm's server).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"skipped": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not out_path.exists():
        return {"error": f"exit {proc.returncode}: {(stderr or stdout)[-2000:]}"}
    return json.loads(out_path.read_text())


def reusable(spec: dict, workdir: Path, tag: str) -> dict | None:
    """The finished result of an identical spec in `workdir` (for --reuse), else None."""
    spec_path, out_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json"
    if spec_path.exists() and out_path.exists() and json.loads(spec_path.read_text()) == json.loads(json.dumps(spec)):
        return {**json.loads(out_path.read_text()), "reused_result": str(out_path)}
    return None


def failed(result: dict) -> bool:
    """True when an arm's result holds no figures (skipped or error)."""
    return "skipped" in result or "error" in result


def why(result: dict) -> str:
    """One line saying why an arm has no figures."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    lines = (result.get("error") or "error").strip().splitlines() or ["error"]
    return f"error: {lines[-1][-160:]}"


def main(argv: list[str]) -> int:
    module, _, function = argv[0].partition(":")
    spec = json.loads(Path(argv[1]).read_text())
    result = getattr(importlib.import_module(module), function)(spec)
    Path(argv[2]).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
