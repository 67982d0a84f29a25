"""llama.cpp's own Python side for the tests: its `convert_hf_to_gguf.py` run on a test's tiny HF
folders, and the folder holding it, `convert_lora_to_gguf.py`, gguf-py and the chat templates.

That folder is llama.cpp as llama-cpp-python 0.3.36 vendors it, which bench/llama_source.sh
downloads (pip download from the package index: fetched, never installed) and unpacks into
~/.cache/agentkv/build-llama-server-0.3.36/src once; llama-server is built from the same folder.
Where it cannot be fetched (no index), the tests that need it skip with the reason.

The converter runs in a subprocess with the vendored gguf-py first on the path; nothing of it is
imported into agentkv or this process. A test tokenizer (bytes plus special tokens) has no
pre-tokenizer hash the converter knows, so the wrapper names one ("gpt-2"): the comparisons feed
token ids, never text."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
CACHE = Path(os.environ.get("AGENTKV_CACHE", Path.home() / ".cache" / "agentkv"))
SRC = CACHE / f"build-llama-server-{VERSION}" / "src"
FETCH = Path(__file__).resolve().parents[2] / "bench" / "llama_source.sh"
_WRAPPER = """
import sys
sys.path[:0] = [{src!r}, {gguf_py!r}]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
for folder, out in {pairs!r}:
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", {outtype!r}, *{flags!r}]
    convert_hf_to_gguf.main()
"""


@functools.cache
def source_missing() -> str | None:
    """Why llama.cpp's vendored source is not at SRC, or None: fetched there first when absent
    (once per session; a failure is the reason, not retried)."""
    if (SRC / "convert_hf_to_gguf.py").is_file():
        return None
    env = {**os.environ, "PYTHON": sys.executable, "LLAMA_CPP_PYTHON_VERSION": VERSION}
    try:
        done = subprocess.run(["sh", str(FETCH)], env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return f"bench/llama_source.sh did not fetch llama.cpp's source into {SRC} within 900 s"
    if done.returncode != 0 or not (SRC / "convert_hf_to_gguf.py").is_file():
        why = done.stderr.strip()[-300:]
        return f"llama.cpp's source is not at {SRC} and bench/llama_source.sh could not fetch it: {why}"
    return None


def convert_all(pairs: list[tuple[Path, Path]], outtype: str = "f32", flags: tuple[str, ...] = ()) -> list[Path]:
    """Each (HF folder, GGUF path) converted with the converter's extra `flags`, in one subprocess
    (its imports once); returns the GGUF paths, or raises with the converter's stderr tail."""
    pairs = [(str(folder), str(out)) for folder, out in pairs]
    code = _WRAPPER.format(src=str(SRC), gguf_py=str(SRC / "gguf-py"), pairs=pairs, outtype=outtype, flags=list(flags))
    env = {**os.environ, "PYTHONPATH": str(SRC / "gguf-py")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({done.returncode}) on {pairs}:\n{done.stderr[-4000:]}")
    return [Path(out) for _, out in pairs]


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """`folder` (a HF model folder) converted to the GGUF `out`."""
    return convert_all([(folder, out)], outtype)[0]
