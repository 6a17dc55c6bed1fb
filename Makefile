# Two commands from a fresh clone: `make demo` and `make test`. Both create .venv when it is missing.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast setup clean

$(STAMP): pyproject.toml scripts/setup-venv.sh
	@VENV=$(VENV) bash scripts/setup-venv.sh

setup: $(STAMP)

## Evaluate every example candidate against its task and print the summary table.
demo: $(STAMP)
	$(BIN)/drkernel eval --tasks examples/tasks --candidates examples/candidates --out results/demo.jsonl

## The whole test suite (CPU, Triton interpreter).
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) results .pytest_cache
