"""A test's tiny HF hybrid folder converted by llama.cpp's own `convert_hf_to_gguf.py` (the
vendored copy of llama-cpp-python 0.3.36 the llama-server build extracts), in a subprocess
whose path starts with that copy's gguf-py. Nothing of the converter is imported here.

The tests' byte-level tokenizer has no pre-tokenizer hash the converter knows; the wrapper
names "gpt-2" for it (the comparisons feed token ids, never text)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LLAMA_SRC = Path(os.environ.get("AGENTKV_CACHE", Path.home() / ".cache" / "agentkv")) / "build-llama-server-0.3.36/src"
_RUN = """
import sys
sys.path[:0] = [{src!r}, {gguf_py!r}]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
for folder, out in {pairs!r}:
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", "f32", *{flags!r}]
    convert_hf_to_gguf.main()
"""


def converter_missing() -> str | None:
    """Why llama.cpp's converter cannot run here, or None."""
    script = LLAMA_SRC / "convert_hf_to_gguf.py"
    return None if script.is_file() else f"llama.cpp's converter is not at {script}"


def convert_to_gguf(pairs: list[tuple[Path, Path]], flags: tuple[str, ...] = ("--no-mtp",)) -> None:
    """Each (HF folder, GGUF path) converted to an f32 GGUF, in one subprocess, with the
    converter's extra `flags` (the Qwen hybrids' `--no-mtp`; Granite refuses it); raises with
    the converter's stderr tail."""
    pairs = [(str(folder), str(out)) for folder, out in pairs]
    code = _RUN.format(src=str(LLAMA_SRC), gguf_py=str(LLAMA_SRC / "gguf-py"), pairs=pairs, flags=list(flags))
    env = {**os.environ, "PYTHONPATH": str(LLAMA_SRC / "gguf-py")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({done.returncode}) on {pairs}:\n{done.stderr[-3000:]}")
