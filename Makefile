# Two commands from a fresh clone: `make demo` and `make test`. Both create .venv when it is missing.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-limits test-fast setup clean

$(STAMP): pyproject.toml scripts/setup-venv.sh
	@VENV=$(VENV) bash scripts/setup-venv.sh

setup: $(STAMP)

## Evaluate every example candidate against its task and print the summary table.
demo: $(STAMP)
	$(BIN)/drkernel eval --tasks examples/tasks --candidates examples/candidates --out results/demo.jsonl

## The whole test suite (CPU, Triton interpreter).
test: $(STAMP)
	$(BIN)/python -m pytest -q

## The red-team and isolation suites under an inherited hard RLIMIT_AS of 12 GiB and 256 open files (a batch
## scheduler's or an admin's ulimit): every verdict must be the same as without limits.
test-limits: $(STAMP)
	$(BIN)/python -c "import os, resource, sys; \
	resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30)); resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); \
	os.execv(sys.executable, [sys.executable, '-m', 'pytest', '-q', 'tests/test_hacking.py', 'tests/test_isolation.py'])"

clean:
	rm -rf $(VENV) results .pytest_cache
