#!/usr/bin/env bash
# Profile the `python` workload on a free-threaded CPython with perf: what share of the CPU samples falls in
# _Py_DecRefShared when two thread workers read shared constants, against their own copies (notebook 09).
#
#   bash scripts/perf_decref.sh [PYTHON] [OUT]
#
# PYTHON: a free-threaded CPython that imports minidl and NumPy (default .venv-ft/bin/python, from `make ft`).
# OUT: the summary it writes (default results/threads/perf_decref.txt): one `share <version> <percent>` line
# per version, for notebook 09 to read, then the top symbols of each profile.
# Needs `perf` and kernel.perf_event_paranoid <= 2: it samples only user space, of its own processes.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${1:-$REPO/.venv-ft/bin/python}
OUT=${2:-$REPO/results/threads/perf_decref.txt}
SAMPLES=${PERF_SAMPLES:-1024}  # samples of the workload per profile (a few seconds of work each)
die() { echo "perf_decref.sh: error: $*" >&2; exit 1; }

command -v perf >/dev/null || die "perf is not installed (Debian: apt-get install linux-perf)"
perf stat -e cpu-clock:u true >/dev/null 2>&1 || die "perf cannot sample here (see /proc/sys/kernel/perf_event_paranoid)"
[[ -x $PY ]] || die "$PY not found: run \`make ft\`, or pass a free-threaded python"
PYTHONPATH=$REPO "$PY" -c 'import sys; sys.exit(sys._is_gil_enabled())' \
    || die "$PY runs with the GIL: this profile needs a free-threaded build"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/drive.py" <<'EOF'
import sys

import minidl
from minidl_bench.workloads import PythonWorkload

version, n = sys.argv[1], int(sys.argv[2])
dataset = PythonWorkload(n, shared_constants=version == "shared")
loader = minidl.DataLoader(dataset, batch_size=16, num_workers=2, worker_method="thread",
                           collate_fn=minidl.numpy_collate)
for _ in loader:
    pass
EOF

# perf report's flat profile: one "percent symbol" line per symbol, self time only, biggest first.
flat() {
    perf report -i "$1" --stdio --no-children --sort symbol --percent-limit 0.01 2>/dev/null \
        | awk '$1 ~ /%$/ && $2 == "[.]" {sub(/%/, "", $1); print $1, $3}'
}

{
    echo "# perf profile of the python workload, 2 thread workers ($SAMPLES samples), $(date -u +%Y-%m-%d)"
    echo "# $(PYTHONPATH=$REPO "$PY" -c 'from minidl_bench import describe; print(describe())')"
    echo "# command: bash scripts/perf_decref.sh ${PY#"$REPO"/}  (perf record -e cpu-clock:u -F 2000, self time)"
    echo "# share <constants> <percent of the samples in _Py_DecRefShared> (0.00: under perf report's 0.01% cutoff)"
} >"$work/summary"
for version in shared own; do
    # One BLAS thread: NumPy's idle OpenBLAS threads would otherwise spin in the profile.
    PYTHONPATH=$REPO OPENBLAS_NUM_THREADS=1 perf record -q -e cpu-clock:u -F 2000 -o "$work/$version.data" -- \
        "$PY" "$work/drive.py" "$version" "$SAMPLES" 2>"$work/$version.err" \
        || { cat "$work/$version.err" >&2; die "perf record failed"; }
    flat "$work/$version.data" >"$work/$version.flat"
    share=$(awk '$2 == "_Py_DecRefShared" {print $1}' "$work/$version.flat")
    total=$(perf script -i "$work/$version.data" -F ip 2>/dev/null | wc -l)
    echo "share $version ${share:-0.00} of $total samples" >>"$work/summary"
done
for version in shared own; do
    echo "# top symbols, $version constants (percent of samples, self time)" >>"$work/summary"
    head -8 "$work/$version.flat" | sed 's/^/#   /' >>"$work/summary"
done
mkdir -p "$(dirname "$OUT")"
cp "$work/summary" "$OUT"
cat "$OUT"
