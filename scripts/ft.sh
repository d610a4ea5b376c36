#!/usr/bin/env bash
# Set up .venv-ft: a free-threaded (no-GIL) CPython 3.13+ with minidl installed editable, without torch.
#
#   bash scripts/ft.sh [VENV]          (what `make ft` runs; VENV defaults to .venv-ft)
#
# The interpreter comes from the first of:
#   1. $FT_PYTHON, if set (a path to a free-threaded python);
#   2. python3.14t or python3.13t on PATH;
#   3. a build this script made before, in $FT_PREFIX (default ~/.cache/minidl/cpython-${FT_VERSION}t);
#   4. uv, if installed: `uv python find ${FT_VERSION}t`, else `uv python install ${FT_VERSION}t`;
#   5. a build from source, into $FT_PREFIX, reused by every later run (about 3-5 minutes on 2 cores).
#      The source is Debian's python${FT_VERSION} source package (suite trixie for 3.13, else forky, or
#      $FT_DEBIAN_SUITE), whose .orig.tar.xz is the upstream Python tarball. apt fetches and verifies
#      it, but through a private state directory: the system's apt sources, lists and caches are not
#      touched. Debian's own patches are not applied; this is a plain `./configure --disable-gil` build
#      (no PGO, no tests).
# FT_VERSION (default 3.13) picks the minor version for steps 3-5. 3.13 is the default because its source
# route works here; for 3.14, this machine's Debian mirror listed 3.14.8-3.14.10 in forky/sid while its
# pool held only 3.14.4-3.14.7, so apt's download failed (404): build it by hand and pass FT_PYTHON.
# Every candidate is checked: CPython >= 3.13 built with Py_GIL_DISABLED=1.
# `bash scripts/ft.sh --available` sets nothing up: it exits 0 if an interpreter can be had by the steps
# above (found, from uv, or a source build where apt-get can fetch the source), else prints why and exits 3.
set -euo pipefail

AVAILABLE_ONLY=
if [[ ${1:-} == --available ]]; then AVAILABLE_ONLY=1; shift; fi
VENV=${1:-.venv-ft}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/minidl
FT_VERSION=${FT_VERSION:-3.13}
FT_PREFIX=${FT_PREFIX:-$CACHE_ROOT/cpython-${FT_VERSION}t}
BUILT=$FT_PREFIX/bin/python${FT_VERSION}t  # what a build from source (step 5) installs
FT_JOBS=${FT_JOBS:-$(nproc 2>/dev/null || echo 2)}
DEBIAN_SUITE=${FT_DEBIAN_SUITE:-$([[ $FT_VERSION == 3.13 ]] && echo trixie || echo forky)}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

step() { echo "==> $*"; }
run() { echo "+ $*"; "$@"; }
die() { echo "ft.sh: error: $*" >&2; exit 1; }
# Like run, but the command's output goes to the build log $LOG (shown in part if it fails).
logged() {
    echo "+ $*  >>$LOG"
    "$@" >>"$LOG" 2>&1 || { tail -40 "$LOG"; die "'$*' failed; the whole log is $LOG"; }
}

# Prints the interpreter's version if it is a free-threaded CPython >= 3.13; fails otherwise.
is_free_threaded() {
    [[ -x "$1" ]] || return 1
    "$1" - <<'EOF' 2>/dev/null
import sys, sysconfig
ok = sys.implementation.name == "cpython" and sys.version_info >= (3, 13) and sysconfig.get_config_var("Py_GIL_DISABLED") == 1
print(sys.version.split()[0] + "t")
sys.exit(0 if ok else 1)
EOF
}

# Whether an earlier run of this script finished a build into $FT_PREFIX (the marker is written last).
earlier_build() {
    [[ -f "$FT_PREFIX/.minidl-build-complete" ]] && is_free_threaded "$BUILT" >/dev/null
}

# --- 1-4: an interpreter that is already there, or that uv can give ----------------------------------
find_python() {
    local candidate
    if [[ -n "${FT_PYTHON:-}" ]]; then
        step "using FT_PYTHON=$FT_PYTHON"
        FT_PYTHON=$(command -v "$FT_PYTHON" || echo "$FT_PYTHON")
        is_free_threaded "$FT_PYTHON" >/dev/null || die "FT_PYTHON=$FT_PYTHON is not a free-threaded CPython >= 3.13"
        PY=$FT_PYTHON; return 0
    fi
    for name in python3.14t python3.13t; do
        step "looking for $name on PATH"
        candidate=$(command -v "$name" || true)
        if [[ -n "$candidate" ]] && is_free_threaded "$candidate" >/dev/null; then PY=$candidate; return 0; fi
    done
    step "looking for an earlier build in $FT_PREFIX"
    if earlier_build; then PY=$BUILT; return 0; fi
    step "looking for uv"
    if command -v uv >/dev/null; then
        candidate=$(uv python find ${FT_VERSION}t 2>/dev/null || true)
        if [[ -z "$candidate" ]]; then
            run uv python install ${FT_VERSION}t || true
            candidate=$(uv python find ${FT_VERSION}t 2>/dev/null || true)
        fi
        if [[ -n "$candidate" ]] && is_free_threaded "$candidate" >/dev/null; then PY=$candidate; return 0; fi
        echo "    uv found no free-threaded $FT_VERSION"
    else
        echo "    uv is not installed"
    fi
    return 1
}

# --- 5: build from source ---------------------------------------------------------------------------
# The Debian mirror apt already uses here (first deb.../debian URI of the system's sources), so the
# download goes where this machine is allowed to go; deb.debian.org if none is configured.
debian_mirror() {
    local uri
    uri=$(grep -hoE '(https?|file)://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
          /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | tr -d ' ' || true)
    echo "${FT_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

check_build_deps() {
    command -v dpkg-query >/dev/null || { echo "    not a Debian system: skipping the build-dependency check"; return 0; }
    local needed=(gcc make pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev)
    local optional=(libreadline-dev libncurses-dev uuid-dev tk-dev libgdbm-dev libexpat1-dev)
    local missing=() pkg
    for pkg in "${needed[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    for pkg in "${optional[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || echo "    optional $pkg is missing: the module that needs it will not be built"
    done
    if ((${#missing[@]})); then
        if [[ $(id -u) -eq 0 ]]; then
            echo "    missing build dependencies: ${missing[*]}; installing them with apt-get (running as root)"
            run apt-get install -y --no-install-recommends "${missing[@]}"
        else
            die "missing build dependencies: ${missing[*]} (sudo apt-get install ${missing[*]}, then rerun)"
        fi
    fi
}

build_python() {
    command -v apt-get >/dev/null || die "no free-threaded python found and no apt-get to fetch the source:
    install python${FT_VERSION}t (or uv), or set FT_PYTHON=/path/to/python${FT_VERSION}t"
    step "building a free-threaded CPython into $FT_PREFIX (one time; later runs reuse it)"
    check_build_deps
    mkdir -p "$CACHE_ROOT"
    local work
    work=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT

    step "fetching Debian's python$FT_VERSION source package ($DEBIAN_SUITE) with a private apt state in $work/apt"
    local mirror signed_by=""
    mirror=$(debian_mirror)
    [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] \
        && signed_by="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
    echo "deb-src ${signed_by}$mirror $DEBIAN_SUITE main" >"$work/apt/sources.list"
    echo "    $(cat "$work/apt/sources.list")"
    local apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
                    -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache")
    # As root, apt downloads as the _apt user, who can't write to our private directories.
    [[ $(id -u) -eq 0 ]] && apt_opts+=(-o "APT::Sandbox::User=root")
    run apt-get -q "${apt_opts[@]}" update
    (cd "$work/src" && run apt-get -q "${apt_opts[@]}" source --download-only python$FT_VERSION)

    step "unpacking the upstream tarball"
    local tarball
    tarball=$(ls "$work"/src/python${FT_VERSION}_*.orig.tar.xz)
    run tar -xJf "$tarball" -C "$work/src"
    local srcdir
    srcdir=$(ls -d "$work"/src/Python-${FT_VERSION}*/)

    step "configure --disable-gil, make -j$FT_JOBS, make install"
    rm -rf "$FT_PREFIX"
    LOG=$FT_PREFIX.build.log
    : >"$LOG"
    cd "$srcdir"
    logged ./configure --disable-gil --prefix="$FT_PREFIX" --with-ensurepip=install
    logged make -j"$FT_JOBS"
    logged make install
    cd "$REPO"
    grep -m1 -A1 "The necessary bits to build these optional modules were not found" "$LOG" | sed 's/^/    /' || true
    is_free_threaded "$BUILT" >/dev/null || die "$BUILT is not free-threaded"
    basename "$tarball" >"$FT_PREFIX/.minidl-build-complete"
    PY=$BUILT
}

# --- the interpreter -------------------------------------------------------------------------------
cd "$REPO"
PY=
if [[ -n $AVAILABLE_ONLY ]]; then
    if find_python >/dev/null || earlier_build || command -v apt-get >/dev/null; then exit 0; fi
    echo "no free-threaded CPython 3.13+ on PATH (python3.14t, python3.13t), no uv, and no apt-get to build one"
    exit 3
fi
if ! find_python; then
    # One build at a time, even when two `make ft` run at once; the second reuses the first's.
    mkdir -p "$CACHE_ROOT"
    exec 9>"$FT_PREFIX.lock"
    step "waiting for the build lock $FT_PREFIX.lock"
    flock 9
    if earlier_build; then
        PY=$BUILT
    else
        build_python
    fi
    exec 9>&-
fi
step "interpreter: $PY ($(is_free_threaded "$PY"))"

# --- the virtual environment -----------------------------------------------------------------------
if is_free_threaded "$VENV/bin/python" >/dev/null \
        && [[ "$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')" -ef "$PY" ]]; then
    step "reusing $VENV"
else
    step "creating $VENV"
    run rm -rf "$VENV"
    run "$PY" -m venv "$VENV"
fi
run "$VENV/bin/python" -m pip install -q --upgrade pip
# [ft] holds exact pins of the packages with free-threaded wheels (see pyproject.toml); no torch.
# Wheels only: a package without a cp313t wheel fails here, plainly, instead of in a source build
# that needs a Rust or C toolchain and the network (hypothesis's sdist fetches crates, for one).
run "$VENV/bin/python" -m pip install -q --only-binary=:all: -e '.[ft]'

step "checking the GIL stays off"
run "$VENV/bin/python" - <<'EOF'
import sys
import sysconfig

assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1, "not a free-threaded build"
import minidl, numpy, psutil, PIL.Image, tqdm  # noqa: E401,F401  each could re-enable the GIL on import

assert not sys._is_gil_enabled(), "an extension module re-enabled the GIL"
assert "torch" not in sys.modules
print(f"    Python {sys.version.split()[0]} free-threaded, GIL enabled: {sys._is_gil_enabled()}, "
      f"numpy {numpy.__version__}, psutil {psutil.__version__}, pillow {PIL.__version__}")
EOF
step "done: $VENV is ready (make test-ft runs the torch-free tests in it)"
