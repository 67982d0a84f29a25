"""llama.cpp's own `convert_hf_to_gguf.py` run on a test's tiny HF folder, in a subprocess with
the vendored gguf-py first on the path (the converter of llama-cpp-python 0.3.36, extracted by
the llama-server build into ~/.cache/agentkv/build-llama-server-0.3.36/src). Nothing of it is
imported into agentkv or this process.

A test tokenizer (bytes plus special tokens, no merges) has no pre-tokenizer hash the converter
knows, so the wrapper names one ("gpt-2"): the comparisons feed token ids, never text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(os.environ.get("AGENTKV_CACHE", Path.home() / ".cache" / "agentkv")) / "build-llama-server-0.3.36" / "src"
_WRAPPER = """
import sys
sys.path[:0] = [{src!r}, {gguf_py!r}]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
convert_hf_to_gguf.main()
"""


def converter_missing() -> str | None:
    """Why the converter cannot run here, or None."""
    if not (SRC / "convert_hf_to_gguf.py").is_file():
        return f"llama.cpp's convert_hf_to_gguf.py is not at {SRC} (the llama-server build extracts it)"
    return None


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """`folder` (a HF model folder) converted to the GGUF `out`; raises with the converter's output."""
    args = [str(folder), "--outfile", str(out), "--outtype", outtype]
    code = _WRAPPER.format(src=str(SRC), gguf_py=str(SRC / "gguf-py"), args=args)
    env = {**os.environ, "PYTHONPATH": f"{SRC / 'gguf-py'}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return out
