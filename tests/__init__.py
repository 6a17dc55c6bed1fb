"""drkernel's tests: a package, so that `tests.*` names this folder even where another distribution installed a
top-level `tests` package (verl 0.9.1's wheel does)."""
