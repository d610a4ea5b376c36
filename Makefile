# minidl: `make lab` to learn, `make test` to check. Both set up .venv on first use.
# The newest working python3.11 ... python3.14 on PATH (scripts/find_python.sh), unless PYTHON= says otherwise.
PYTHON ?= $(shell sh scripts/find_python.sh)
VENV   ?= .venv
BIN    := $(VENV)/bin
# The stamp's name carries a hash of the dependency file: edit pyproject.toml and setup reruns;
# otherwise a second `make test` or `make lab` installs nothing.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
PYTEST := $(BIN)/python -m pytest
# Every core runs tests (pytest-xdist), one test file to a process: most tests wait on the workers they start.
XDIST ?= -n auto --dist loadfile
LAB_ARGS ?=
# JupyterLab refuses to start as root unless told; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-stages check chromium lint unit unit-forkserver unit-spawn nbval nbval-fork nbval-spawn \
	browser mac bench clean ft test-ft bench-ft

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[torch,lab,test]'
	rm -f $(VENV)/.installed-*
	touch $@

lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# Each start method runs the notebooks once: `make nbval` compares their outputs under forkserver (Linux's default
# from Python 3.14) on a fake other machine; `make mac` runs them under spawn in the Mac stand-in; `make browser`
# (.ci/run) runs them under fork in JupyterLab. The torch-free tests run again free-threaded (make test-ft).
# CONTRIBUTING.md, "What `make test` runs", says what each stage checks and what it took.
TEST_STAGES := setup lint unit unit-forkserver unit-spawn nbval mac test-ft
test: $(TEST_STAGES)

# .ci/run runs and times the stages one by one.
test-stages:
	@echo $(TEST_STAGES)

# The edit-test loop, about a minute on 2 cores: lint, the loader's own tests and doctests, and one notebook compared.
CHECK_TESTS := tests/test_sampler.py tests/test_dataset.py tests/test_collate.py tests/test_fetch.py \
	tests/test_dataloader.py tests/test_worker.py tests/test_shutdown.py tests/test_pin_memory.py tests/test_prefetch.py
check: setup lint
	$(PYTEST) $(XDIST) $(CHECK_TESTS) minidl --doctest-modules
	$(NBVAL_CMD) notebooks/04_single_process_loader.ipynb

lint: setup
	$(BIN)/ruff check .

# Unit tests plus the doctest examples in the package's docstrings.
unit: setup
	$(PYTEST) $(XDIST) tests minidl minidl_course minidl_bench --doctest-modules

# The tests that start process workers, again with the default start method set to forkserver (Linux
# from Python 3.14): tests/start_method/sitecustomize.py reads MINIDL_START_METHOD in every process of the run.
# Tests about fork itself ask for it by name. The resume tests run their cases that start worker processes there,
# with fewer save points (see OTHER_START_METHOD in tests/resumetools.py).
MP_TESTS := tests/test_worker.py tests/test_dataloader.py tests/test_torch_parity_loader.py tests/test_faults.py \
	tests/test_shutdown.py $(wildcard tests/test_resume_*.py) tests/test_pin_memory.py tests/test_datapipes.py

# The randomized resume test draws 12 settings under fork (make unit) and 4 here.
unit-forkserver: setup
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/start_method MINIDL_START_METHOD=forkserver MINIDL_RESUME_EXAMPLES=4 \
		$(PYTEST) $(XDIST) $(MP_TESTS)

# Under spawn (macOS, Windows), the tests whose outcome spawn itself can change. A forkserver worker is already a
# fresh process that unpickles everything a spawned one does (its server is a new interpreter: nothing of the test
# process is inherited, and the main module is prepared the same way), so what spawn alone adds is checked here:
# a worker that is this process's own child (its death reaches our SIGCHLD handler, as under fork) yet takes
# seconds to start, as it imports torch anew: the death of a worker still starting or mid-epoch (test_faults), and
# shutdown and the main-module guard (test_shutdown). test_picklable, test_worker's every-start-method test, and the
# spawn tests of test_resume_mid_epoch and test_datapipes name spawn themselves, so `make unit` runs them.
# The randomized resume sweep runs here too (3 settings): each resumed loader's workers unpickle what it sends.
SPAWN_TESTS := tests/test_faults.py tests/test_shutdown.py tests/test_resume_sweep.py
unit-spawn: setup
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/start_method MINIDL_START_METHOD=spawn MINIDL_RESUME_EXAMPLES=3 \
		$(PYTEST) $(XDIST) $(SPAWN_TESTS)


# Every notebook, run in a fresh kernel and compared with its committed outputs, in quick mode, with the default
# start method set to forkserver (Linux from Python 3.14), on a fake other machine (scripts/other_machine.sh: another
# CPU model, one core for each notebook), which proves no compared output depends on the machine. `make nbval-fork`
# and `make nbval-spawn` compare them under the other two (outside `make test`: the browser run and `make mac` run
# every notebook under those). DataLoader's warning about more workers than cores is the one stderr line that
# depends on the core count: the kernels run without it here (a learner still sees it).
# A cell may take up to 300 s (pytest-timeout; 120 s for the unit tests): under spawn every worker is a fresh
# interpreter that imports torch, and ch12's num_workers sweep starts 16 of them a round.
# tests/nbval_leaks.py fails a cell that leaves a process it started running after it (a worker outlived its cell).
NBVAL_CMD := env MINIDL_QUICK=1 PYTHONWARNINGS="ignore:This DataLoader will create:UserWarning" $(PYTEST) \
	-p no:cacheprovider -p tests.nbval_leaks -p tests.one_core_each --timeout=300 --nbval --nbval-current-env \
	--nbval-sanitize-with tests/nbval_sanitize.cfg
NBVAL := $(NBVAL_CMD) $(XDIST) notebooks
START_METHOD = PYTHONPATH=$(CURDIR)/tests/start_method MINIDL_START_METHOD=$(1)

nbval: setup
	$(call START_METHOD,forkserver) bash scripts/other_machine.sh $(NBVAL)

nbval-fork: setup
	bash scripts/other_machine.sh $(NBVAL)

nbval-spawn: setup
	$(call START_METHOD,spawn) $(NBVAL)

# JupyterLab in headless Chromium: every notebook opened, Run All in quick mode, error cells, missing plots and
# console errors reported (scripts/browser_run.py), two notebooks at a time. Debian's chromium is installed if missing.
CHROMIUM ?= /usr/bin/chromium

browser: setup chromium
	CHROMIUM=$(CHROMIUM) $(BIN)/python scripts/browser_run.py

chromium:
	test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# Every chapter and exercise notebook run top to bottom in quick mode in a stand-in for macOS (tests/mac_standin:
# spawn, torch's file_system strategy only, no /proc or /dev/shm, psutil without PSS, no sched_getaffinity), error
# cells reported as `make browser` does, outputs not compared (scripts/mac_run.py; CONTRIBUTING.md, "The Mac stand-in").
# Notebooks with no process worker and no platform fact are left out (scripts/mac_run.py's SKIPPED).
mac: setup
	$(BIN)/python scripts/mac_run.py

bench: setup
	$(BIN)/python -m minidl_bench

# .venv-ft: a free-threaded (no-GIL) CPython 3.13+ with minidl and the [ft] pins, no torch. scripts/ft.sh
# finds the interpreter (PATH, an earlier build, uv) or builds it once into ~/.cache/minidl.
FT_VENV  := .venv-ft
FT_HASH  := $(shell cat pyproject.toml | sha256sum | cut -c1-16)
# A venv whose interpreter is gone (~/.cache/minidl deleted) counts as not set up.
FT_STAMP := $(FT_VENV)/.installed-$(FT_HASH)$(if $(realpath $(FT_VENV)/bin/python),,-no-python)
# The torch-free tests. Left out: test_collate/fetch/padding import torch at the top (no collection
# without it). test_dataloader/test_worker skip whole (importorskip); the rest skip their torch-oracle tests.
FT_TESTS := tests/test_freethreaded.py tests/test_without_torch.py tests/test_environment.py \
	tests/test_sampler.py tests/test_dataset.py tests/test_distributed.py \
	tests/test_dataloader.py tests/test_worker.py tests/test_shutdown.py tests/test_bench_threads.py

ft: $(FT_STAMP)

# Under a lock, and only if no other make finished it meanwhile: .ci/run sets it up in the background (niced) while
# the unit tests run, and `make test` reaches test-ft later. Without flock(1) (macOS) make runs it unlocked.
FT_LOCK := $(if $(shell command -v flock 2>/dev/null),flock $(FT_VENV).lock,)
$(FT_STAMP): pyproject.toml scripts/ft.sh
	$(FT_LOCK) sh -c 'test -x $(FT_VENV)/bin/python -a -e $(FT_VENV)/.installed-$(FT_HASH) || \
		{ bash scripts/ft.sh $(FT_VENV) && rm -f $(FT_VENV)/.installed-* && touch $(FT_VENV)/.installed-$(FT_HASH); }'

# Skipped, with a line saying why, where no free-threaded interpreter can be had (a Mac without uv, say).
test-ft:
	@if bash scripts/ft.sh --available; then $(MAKE) --no-print-directory ft && $(FT_VENV)/bin/python -m pytest $(FT_TESTS); \
	else echo "make test-ft: SKIPPED, the torch-free tests did not run free-threaded (install uv, or set FT_PYTHON)"; fi

# Thread workers vs process workers under both builds (~8 min on 2 cores; BENCH_FT_ARGS=--quick: ~1 min),
# each into results/<machine-tag>/, then both side by side in results/threads/ (plots need .venv's matplotlib).
bench-ft: setup ft
	$(FT_VENV)/bin/python -m minidl_bench threads $(BENCH_FT_ARGS)
	$(BIN)/python -m minidl_bench threads $(BENCH_FT_ARGS)
	$(BIN)/python -m minidl_bench.threads_report

clean:
	rm -rf $(VENV) $(FT_VENV) .pytest_cache .ruff_cache .hypothesis
