#!/usr/bin/env sh
# Prints the newest python3.X on PATH that runs and that minidl's pins support (3.11-3.14), for `make`'s PYTHON.
# A name on PATH is not enough: pyenv puts shims there for every version it knows, and a shim for a version
# that is not selected fails when run. So each candidate is run, and the first that works, newest first, wins.
for minor in 14 13 12 11; do
    candidate=python3.$minor
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys, venv' >/dev/null 2>&1; then
        echo "$candidate"
        exit 0
    fi
done
echo "minidl needs Python 3.11 to 3.14 as python3.11 ... python3.14 on PATH (or make PYTHON=/path/to/python)" >&2
exit 1
