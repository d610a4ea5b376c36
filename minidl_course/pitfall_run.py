"""The experiments of notebook 12 that can crash or hang, each run in a child interpreter.

``python -m minidl_course.pitfall_run open_files file_descriptor 128`` and the like: the last line
printed is JSON. ``minidl_course.pitfalls.run_child`` runs these under a timeout and kills the whole
process group if one overstays, so a notebook or a test never hangs on them.
"""

from __future__ import annotations

import json
import sys


def open_files(strategy: str, nofile: int, batches: int = 300) -> dict:
    """Keep every batch (as code that collects outputs does) under an open-files limit of ``nofile``.

    Runs torch's DataLoader, then minidl's, with torch's sharing ``strategy``; for each, how many
    batches were kept and the error that stopped it (``None`` if all ``batches`` came).
    """
    import resource

    import torch.multiprocessing
    import torch.utils.data

    import minidl
    from minidl_course.pitfalls import TensorPairDataset

    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    torch.multiprocessing.set_sharing_strategy(strategy)
    results = {}
    for library, loader_class in (("torch", torch.utils.data.DataLoader), ("minidl", minidl.DataLoader)):
        loader = loader_class(TensorPairDataset(batches * 4, (3, 8, 8)), batch_size=4, num_workers=2,
                              multiprocessing_context="fork")
        kept, error = [], None
        try:
            for batch in loader:
                kept.append(batch)  # two tensors per batch, each its own shared-memory segment
        except Exception as e:  # noqa: BLE001 -- we report whatever the user would see
            error = f"{type(e).__name__}: {e}"
        results[library] = {"kept": len(kept), "error": error}
        del kept, loader  # let go of every descriptor before the next loader starts
    return results


def bus_error() -> None:
    """Touch a mapped page that no longer has memory behind it: the kernel answers with SIGBUS.

    A full ``/dev/shm`` does the same to a worker writing a batch into a segment the size was
    reserved for but the pages were not. Here the file is simply truncated under the mapping.
    """
    import faulthandler
    import mmap
    import resource
    import tempfile

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    faulthandler.enable()  # so the crash names itself on stderr, as a terminal would ("Bus error")
    with tempfile.TemporaryFile() as f:
        f.truncate(2 * mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE)
        f.truncate(0)  # the mapping stays; the memory behind it is gone
        print("writing into the mapped page...", flush=True)
        m[0] = 1  # SIGBUS: this process dies here
        print("never printed")


# --- /dev/shm experiments: run only inside a private mount (and pid) namespace, see pitfalls.run_in_namespace ---


def _private_shm(size_mib: int) -> None:
    """Mount a ``size_mib`` MiB tmpfs over /dev/shm. Only in a private mount namespace: nobody else sees it."""
    import subprocess

    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", "/dev/shm"], check=True)


def shm_full(size_mib: int, batches: int = 8) -> dict:
    """A loader whose batches do not fit a ``size_mib`` MiB /dev/shm: torch's DataLoader, then minidl's.

    Each batch is 32 float32 images of 3 x 64 x 64 (1.5 MiB) and their labels; two workers with
    ``prefetch_factor=2`` want four of them in shared memory at once. For each loader: how many batches
    came, and the error (``None`` if every batch came). Then the same shortage for code that sizes a
    segment without reserving it (``multiprocessing.shared_memory``): a child process, and how it ended.
    """
    import subprocess

    import torch.utils.data

    import minidl
    from minidl_course.pitfalls import TensorPairDataset

    _private_shm(size_mib)
    results = {"size_mib": size_mib, "batch_bytes": 32 * 3 * 64 * 64 * 4 + 32 * 8}
    for library, loader_class in (("torch", torch.utils.data.DataLoader), ("minidl", minidl.DataLoader)):
        loader = loader_class(TensorPairDataset(32 * batches, (3, 64, 64)), batch_size=32, num_workers=2,
                              multiprocessing_context="fork")
        came, error = 0, None
        try:
            for _batch in loader:
                came += 1
        except Exception as e:  # noqa: BLE001 -- we report whatever the user would see
            error = f"{type(e).__name__}: {e}"
        results[library] = {"batches": came, "of": batches, "error": error}
        del loader
    child = subprocess.run([sys.executable, "-m", "minidl_course.pitfall_run", "shm_write", str(2 * size_mib)],
                           capture_output=True, text=True, timeout=60)
    results["shared_memory"] = {"returncode": child.returncode, "stdout": child.stdout, "stderr": child.stderr}
    return results


def shm_write(size_mib: int) -> None:
    """Create a ``size_mib`` MiB ``multiprocessing.shared_memory`` block and fill it: it is sized, not reserved."""
    import faulthandler
    import resource
    from multiprocessing import shared_memory

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    faulthandler.enable()  # so the crash names itself on stderr ("Fatal Python error: Bus error")
    block = shared_memory.SharedMemory(create=True, size=size_mib * 2**20)
    print(f"created /dev/shm{block._name} of {size_mib} MiB; writing...", flush=True)
    block.buf[:] = b"\x01" * block.size  # SIGBUS at the first page /dev/shm cannot give
    print("written", flush=True)


def _hold_file_system_batches() -> None:
    """Load a few batches under ``file_system`` and keep them; say how many files, then wait to be killed."""
    import time

    import torch.multiprocessing
    import torch.utils.data

    from minidl_course.pitfalls import TensorPairDataset
    from minidl_course.sharing_demo import shm_files, use_file_system_strategy

    torch.multiprocessing.set_sharing_strategy("file_system")  # here, and in each worker (spawned ones start
    kept = list(torch.utils.data.DataLoader(TensorPairDataset(16, (3, 8, 8)), batch_size=4, num_workers=2,
                                            worker_init_fn=use_file_system_strategy))  # with the default)
    print(json.dumps({"kept": len(kept), "files": len(shm_files())}), flush=True)
    time.sleep(600)


def _shm_managers() -> list[int]:
    """pids of the torch_shm_manager processes (this runs in its own pid namespace: they are all ours)."""
    from minidl_course import osfacts

    return osfacts.pids_named("torch_shm_manag") or []  # the kernel cuts a command name at 15 characters


def file_system_leftovers(wait: float = 10.0) -> dict:
    """Under ``file_system``, SIGKILL a process that holds batches: who removes its files from /dev/shm?

    Twice: once killing only that process (``torch_shm_manager`` lives on and cleans up: we time it, up to
    ``wait`` s), once killing its managers as well (the files stay). Needs its own pid namespace
    (``_shm_managers`` kills every manager it sees).
    """
    import os
    import signal
    import subprocess
    import time

    from minidl_course.sharing_demo import shm_files  # torch's files only, not spawn's sem.mp-... semaphores

    _private_shm(64)
    results = {}
    for case in ("process killed", "process and torch_shm_manager killed"):
        before = set(_shm_managers())  # the first case's managers may still be on their way out
        victim = subprocess.Popen([sys.executable, "-m", "minidl_course.pitfall_run", "hold_file_system"],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        held = json.loads(victim.stdout.readline())
        managers = [pid for pid in _shm_managers() if pid not in before]
        victim.kill()
        victim.wait()
        if case != "process killed":
            for pid in managers:
                os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        while shm_files() and time.monotonic() - start < wait:
            time.sleep(0.1)
        left = shm_files()
        results[case] = {"files_held": held["files"], "managers": len(managers), "files_left": len(left),
                         "seconds": round(time.monotonic() - start, 1), "example": left[:1]}
        for name in os.listdir("/dev/shm"):  # this tmpfs vanishes with the namespace anyway; start the next case empty
            os.unlink(os.path.join("/dev/shm", name))
    return results


def fork_lock(method: str, wait: float) -> dict:
    from minidl_course.pitfalls import fork_while_locked

    return fork_while_locked(method, wait)


def main(argv: list[str]) -> None:
    what, args = argv[0], argv[1:]
    if what == "open_files":
        result = open_files(args[0], int(args[1]))
    elif what == "bus_error":
        result = bus_error()
    elif what == "fork_lock":
        result = fork_lock(args[0], float(args[1]))
    elif what == "shm_full":
        result = shm_full(int(args[0]))
    elif what == "shm_write":
        result = shm_write(int(args[0]))
    elif what == "hold_file_system":
        result = _hold_file_system_batches()
    elif what == "file_system_leftovers":
        result = file_system_leftovers()
    else:
        raise SystemExit(f"unknown experiment {what!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
