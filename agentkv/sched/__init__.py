"""Continuous batching and chunked prefill (pure Python, no torch)."""
