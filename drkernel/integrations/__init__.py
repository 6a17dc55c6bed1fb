"""drkernel inside other RL frameworks: `openenv` (an OpenEnv environment) and `verl` (an agent loop, the TRLOO
estimator and drkernel's rejection rules for verl). Each module needs its optional extra."""
