"""Run evaluations in isolated processes: the fork server's supervisor and the per-device sandbox."""
