"""Block pool and radix prefix tree over token ids (pure Python, no torch)."""
