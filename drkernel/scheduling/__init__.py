"""Spread evaluations over devices: the embedded scheduler (worker processes), the Ray backend, the engine's name
(engine.py) and the evaluator every engine user opens (evaluator.py)."""
