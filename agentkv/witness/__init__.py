"""Witnesses: approx backends checked op by op and per model against the reference."""
