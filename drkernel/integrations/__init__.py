"""drkernel inside other RL frameworks: `openenv` (an OpenEnv environment). Each module needs its optional extra."""
