#!/usr/bin/env bash
# Runs a command as if on another machine: /proc/cpuinfo names another CPU model, and the command may use one
# core only (its affinity mask, which is what minidl, torch and os.process_cpu_count() count). It proves that no
# compared notebook output depends on the machine: `make nbval` runs nbval through it.
#
#   bash scripts/other_machine.sh COMMAND [ARGS...]
#
# How: a private mount namespace (unshare -m), where a copy of /proc/cpuinfo with another model name is
# bind-mounted over the real one; nothing outside the namespace sees it. CI runs it as root; elsewhere it uses
# a user namespace, or, where none can be made, runs the command as it is and says so.
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
FAKE_MODEL=${FAKE_MODEL:-"Other Vendor CPU 9000 @ 1.00GHz"}
if [[ -z "${MINIDL_OTHER_MACHINE:-}" ]]; then
    # As root a mount namespace is enough; as a user, a user namespace too (most Linux distributions allow it).
    for how in "-m" "-Urm"; do
        if unshare $how --propagation private true 2>/dev/null; then
            exec env MINIDL_OTHER_MACHINE=1 unshare $how --propagation private "$0" "$@"
        fi
    done
    echo "other_machine.sh: no mount namespace can be made here (not Linux, or namespaces are off), so the" \
         "command runs on this machine as it is, without playing another one" >&2
    exec "$@"
fi
# Inside the namespace.
fake=$(mktemp)
trap 'umount /proc/cpuinfo 2>/dev/null; rm -f "$fake"' EXIT
sed "s/^model name.*/model name\t: $FAKE_MODEL/" /proc/cpuinfo >"$fake"
mount --bind "$fake" /proc/cpuinfo
echo "other_machine.sh: CPU '$FAKE_MODEL', 1 core (taskset -c 0)" >&2
# The cores the machine has, for a run that gives each of its processes a core of its own (tests/one_core_each.py).
MINIDL_MACHINE_CORES=$(taskset -cp $$ | sed 's/.*: //') taskset -c 0 "$@"
