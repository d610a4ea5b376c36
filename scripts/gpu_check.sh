#!/usr/bin/env bash
# One prepared run on a CUDA machine: the `gpu`-marked tests, then `python -m minidl_bench gpu` in full mode.
#
#   scripts/gpu_check.sh OUT_DIR          # e.g. scripts/gpu_check.sh "$OUT" on the lent GPU machine
#
# Writes into OUT_DIR: gpu_check.log (the GPU, driver, torch and CUDA versions, what was run and how it ended:
# everything this script prints), gpu.csv, gpu_rounds.csv and gpu_*.png (the bench: pinned against pageable
# copy bandwidth; h2d-wait, how long x.to("cuda") holds the loop's thread after a queued step, blocking or
# not, pageable or pinned; the prefetcher's hidden share; minidl's pin thread beside torch's), gpu_tests.xml
# and gpu_tests.txt (pytest's reports, when pytest is there). Runs from the checkout with PYTHONPATH set to it;
# the interpreter is $PYTHON, else python3 (the GPU machine has its own torch with CUDA and no network:
# nothing is installed). Every step runs under `timeout`, none past DEADLINE (7m40s from the start): the
# script ends inside 8 minutes. Without CUDA (or without torch) it says so and exits 0, having measured
# nothing. Otherwise it exits 0 when the tests (if pytest is there) and the bench both passed, 1 if either
# failed, timed out, or a gpu test was skipped.
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
export TQDM_DISABLE=1  # no progress bar in the log (the lines it would write still print)
unset MINIDL_QUICK  # full mode
PY=${PYTHON:-python3}
DEADLINE=460  # seconds after the start; each step's limit is cut to what is left of it
TESTS_LIMIT=150
BENCH_LIMIT=270

# limit SECONDS: the step's own limit, or what is left before DEADLINE if that is less (at least 1 s)
limit() {
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt "$1" ]; then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}

main() {
echo "== gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n)"
echo "checkout: $root (commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
echo "output:   $out"
echo "python:   $PY = $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null; then
    timeout "$(limit 20)" nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
        --format=csv || echo "nvidia-smi failed (exit $?)"
else
    echo "nvidia-smi: not found"
fi

echo "== packages"
timeout "$(limit 30)" "$PY" - <<'EOF'
import importlib.metadata
import importlib.util

for name in ("numpy", "torch", "pytest", "pytest_timeout", "hypothesis", "psutil", "matplotlib", "tqdm"):
    if importlib.util.find_spec(name) is None:
        print(f"{name}: not installed")
        continue
    try:
        version = importlib.metadata.version(name.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        version = "importable, version unknown"
    print(f"{name}: {version}")
EOF

echo "== torch and CUDA"
timeout "$(limit 60)" "$PY" - <<'EOF'
import sys

try:
    import torch
except ImportError as error:
    print(f"torch: cannot be imported ({error})")
    sys.exit(3)
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
if not torch.cuda.is_available():
    print("torch.cuda.is_available() is False")
    sys.exit(3)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"device {i}: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
          f"{p.multi_processor_count} SMs")
try:  # a private call: the newest CUDA the driver supports (nvidia-smi above names the driver itself)
    v = torch._C._cuda_getDriverVersion()
    print(f"the driver supports CUDA up to {v // 1000}.{v % 1000 // 10}")
except (AttributeError, RuntimeError):
    pass
EOF
status=$?
if [ "$status" -eq 3 ]; then
    echo "== no CUDA here: nothing to test or measure (the gpu tests and the gpu bench need a CUDA device)"
    return 0
elif [ "$status" -ne 0 ]; then
    echo "== checking for CUDA failed (exit $status): nothing measured"
    return 1
fi
timeout "$(limit 30)" "$PY" -c "import minidl_bench.machine as m; print('machine:', m.describe()); print('tag:', m.machine_tag())"

failed=0
echo "== gpu-marked tests"
files=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
if ! "$PY" -c "import pytest" 2>/dev/null; then
    echo "pytest is not installed for $PY: the gpu tests ($files) were NOT run; only the bench below"
else
    opts=(-m gpu -p no:cacheprovider -q -rA --junitxml="$out/gpu_tests.xml")
    if ! "$PY" -c "import pytest_timeout" 2>/dev/null; then
        # pyproject's --strict-markers would refuse @pytest.mark.timeout without the plugin; `timeout` guards instead
        echo "pytest-timeout is not installed: running without --strict-markers and per-test timeouts"
        opts+=(-o "addopts=-ra" -W "ignore::pytest.PytestUnknownMarkWarning" -W "ignore::pytest.PytestConfigWarning")
    fi
    tests_limit=$(limit "$TESTS_LIMIT")
    echo "$PY -m pytest ${opts[*]} $files (limit ${tests_limit} s)"
    # shellcheck disable=SC2086  # $files is a list of paths without spaces
    timeout -k 5 "$tests_limit" "$PY" -m pytest "${opts[@]}" $files | tee "$out/gpu_tests.txt"
    status=${PIPESTATUS[0]}
    case $status in
        0) if tail -n 1 "$out/gpu_tests.txt" | grep -q skipped; then
               echo "gpu tests: passed, but some were SKIPPED on a CUDA machine (see above)"; failed=1
           else
               echo "gpu tests: passed"
           fi ;;
        124|137) echo "gpu tests: TIMED OUT after ${tests_limit} s"; failed=1 ;;
        5) echo "gpu tests: none collected (exit 5)"; failed=1 ;;
        *) echo "gpu tests: FAILED (pytest exit $status)"; failed=1 ;;
    esac
fi

bench_limit=$(limit "$BENCH_LIMIT")
echo "== python -m minidl_bench gpu --out $out (full mode, limit ${bench_limit} s)"
timeout -k 5 "$bench_limit" "$PY" -m minidl_bench gpu --out "$out"
status=$?
case $status in
    0) if [ -s "$out/gpu.csv" ]; then echo "gpu bench: done"; else echo "gpu bench: wrote no gpu.csv"; failed=1; fi ;;
    124|137) echo "gpu bench: TIMED OUT after ${bench_limit} s"; failed=1 ;;
    *) echo "gpu bench: FAILED (exit $status)"; failed=1 ;;
esac

echo "== files in $out"
ls -l "$out"
echo "== gpu_check: $(date -u '+%H:%M:%S UTC'), ${SECONDS} s, $([ "$failed" -eq 0 ] && echo "all passed" || echo "SOMETHING FAILED: see above")"
return "$failed"
}

# Everything printed goes to the log as well; the exit status is main's, not tee's.
main 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
