"""Side installs of quant libraries that cannot live in the project's venv, for oracle tests.

AutoAWQ 0.2.9 (the last release) pins an older torch, so it is never pip-installed here: its
sdist is fetched with `pip download --no-deps` into ~/.cache/agentkv/oracles and only its
pure-torch packing module, awq/utils/packing_utils.py, is loaded from the unpacked source.
gptqmodel (7.x needs a newer torch than the venv's) is fetched the same way; its GPTQ
dequantization lives in modules that import CUDA-era dependencies, so just the torch functions
are lifted out of the two source files (see gptqmodel_dequant).
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


GPTQMODEL = "gptqmodel==7.7.0"
_GPTQ_ROOT = "gptqmodel-7.7.0/gptqmodel/"
_GPTQ_FILES = ("nn_modules/qlinear/__init__.py", "utils/model.py")
_GPTQ_FUNCS = {"_torch_shift_factor", "_torch_right_shift", "_torch_left_shift", "convert_gptq_v1_to_v2_format_module"}
_GPTQ_METHODS = {
    "qzero_format",
    "_wf_device",
    "_init_wf_unsqueeze_buffers",
    "dequantize_weight",
    "_dequantize_from_codes",
}


def _fetch_sdist(pin: str, members: list[str]) -> Path:
    """Extracts `members` of the `pin` sdist into the cache (pip download --no-deps, never installed)."""
    folder = CACHE / pin.replace("==", "-")
    if all((folder / m).is_file() for m in members):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", pin, "-d", str(folder), "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    archives = list(folder.glob(f"{pin.split('==')[0]}-*.tar.gz"))
    if done.returncode or not archives:
        raise RuntimeError(f"pip download {pin} failed: {done.stderr.strip()[-300:]}")
    with tarfile.open(archives[0]) as tar:
        for member in members:
            tar.extract(member, folder, filter="data")
    return folder


def gptqmodel_dequant() -> type:
    """gptqmodel's own GPTQ code, lifted out of its modules (whose imports need CUDA-era deps).

    From nn_modules/qlinear/__init__.py: PackableQuantLinear.dequantize_weight (the torch unpack
    by shift buffers, then scales[g_idx] * (q - zeros[g_idx])) with the helpers it calls, and
    GPTQQuantLinear.qzero_format; from
    utils/model.py: convert_gptq_v1_to_v2_format_module (the v1 "+1" zero fix-up, applied as
    gptqmodel does on load). Returns an nn.Module subclass carrying those methods, with
    `.convert_v1_to_v2(module, bits)` as a static method. Only their logger is stubbed.
    """
    import ast

    import torch
    from torch import nn

    members = [_GPTQ_ROOT + f for f in _GPTQ_FILES]
    folder = _fetch_sdist(GPTQMODEL, members)
    funcs, methods = [], []
    for member in members:
        tree = ast.parse((folder / member).read_text(), member)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in _GPTQ_FUNCS:
                funcs.append(node)
            if isinstance(node, ast.ClassDef) and node.name in ("GPTQQuantLinear", "PackableQuantLinear"):
                methods += [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in _GPTQ_METHODS]
    if len(funcs) != len(_GPTQ_FUNCS) or len(methods) != len(_GPTQ_METHODS):
        raise RuntimeError(f"{GPTQMODEL}: expected functions not found in {members}")

    class _Log:
        class info:  # noqa: N801 - mirrors gptqmodel's log.info.once
            @staticmethod
            def once(*_args) -> None:
                pass

    class GptqModelLinear(nn.Module):
        pass

    scope = {"t": torch, "torch": torch, "nn": nn, "log": _Log, "BaseQuantLinear": GptqModelLinear}
    exec(compile(ast.Module(funcs, []), GPTQMODEL, "exec"), scope)  # noqa: S102 - the oracle's own source
    body = {}
    exec(compile(ast.Module(methods, []), GPTQMODEL, "exec"), scope, body)  # noqa: S102
    for name, fn in body.items():
        setattr(GptqModelLinear, name, fn)
    GptqModelLinear.convert_v1_to_v2 = staticmethod(
        lambda module, bits: scope["convert_gptq_v1_to_v2_format_module"](module, bits, torch.int32)
    )
    return GptqModelLinear
