# minidl: `make lab` to learn, `make test` to check. Both set up .venv on first use.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# The stamp's name carries a hash of the dependency file: edit pyproject.toml and setup reruns;
# otherwise a second `make test` or `make lab` installs nothing.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
PYTEST := $(BIN)/python -m pytest
LAB_ARGS ?=

.PHONY: setup lab test lint unit nbval bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[torch,lab,test]'
	rm -f $(VENV)/.installed-*
	touch $@

lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

test: setup lint unit nbval

lint: setup
	$(BIN)/ruff check .

# Unit tests plus the doctest examples in the package's docstrings.
unit: setup
	$(PYTEST) tests minidl --doctest-modules

# Every notebook, run in a fresh kernel and compared with its committed outputs, in quick mode.
nbval: setup
	MINIDL_QUICK=1 $(PYTEST) --nbval --nbval-current-env notebooks

bench: setup
	$(BIN)/python -m minidl.bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
