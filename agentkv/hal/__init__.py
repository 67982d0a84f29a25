"""Compute layer: dtypes, tensor handles, whole-op backends and their registry."""
