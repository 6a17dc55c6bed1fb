"""Spread evaluations over devices: the embedded scheduler (worker processes) and the Ray backend."""
