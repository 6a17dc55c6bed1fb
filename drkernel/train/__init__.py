"""drkernel.train: multi-turn RL training on TRL."""
