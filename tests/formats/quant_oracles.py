"""Side installs of quant libraries that cannot live in the project's venv, for oracle tests.

AutoAWQ 0.2.9 (the last release) pins an older torch, so it is never pip-installed here: its
sdist is fetched with `pip download --no-deps` into ~/.cache/agentkv/oracles and only its
pure-torch packing module, awq/utils/packing_utils.py, is loaded from the unpacked source.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

AUTOAWQ = "autoawq==0.2.9"
CACHE = Path.home() / ".cache" / "agentkv" / "oracles"


def autoawq_packing() -> ModuleType:
    """AutoAWQ's packing_utils module; raises RuntimeError when the sdist cannot be fetched."""
    folder = CACHE / AUTOAWQ.replace("==", "-")
    source = folder / "autoawq-0.2.9" / "awq" / "utils" / "packing_utils.py"
    if not source.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                AUTOAWQ,
                "-d",
                str(folder),
                "-q",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        archives = list(folder.glob("autoawq-*.tar.gz"))
        if done.returncode or not archives:
            raise RuntimeError(f"pip download {AUTOAWQ} failed: {done.stderr.strip()[-300:]}")
        with tarfile.open(archives[0]) as tar:
            tar.extract("autoawq-0.2.9/awq/utils/packing_utils.py", folder, filter="data")
    spec = importlib.util.spec_from_file_location("autoawq_packing_utils", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
