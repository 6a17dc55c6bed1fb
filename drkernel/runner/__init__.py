"""Run evaluations in isolated processes: the supervisor of one device's evaluations (supervisor.py), its side of the
fork server (forkserver.py), and `drkernel.evaluate` (evaluate.py). What runs inside those processes is
drkernel.sandbox."""
