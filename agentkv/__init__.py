"""agentkv: an LLM inference kernel for agent loops."""
__version__ = "0.1.0"
