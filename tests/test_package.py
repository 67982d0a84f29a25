"""The package's public entry points."""

import subprocess
import sys


def test_top_level_exports():
    import agentkv
    from agentkv.runtime.llm import LLM
    from agentkv.runtime.params import SamplingParams

    assert agentkv.LLM is LLM and agentkv.SamplingParams is SamplingParams


def test_cache_and_scheduler_import_without_torch():
    code = "import sys, agentkv.cache, agentkv.sched; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
