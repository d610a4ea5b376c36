"""The experiments of notebook 12 that can crash or hang, each run in a child interpreter.

``python -m minidl.course.pitfall_run open_files file_descriptor 128`` and the like: the last line
printed is JSON. ``minidl.course.pitfalls.run_child`` runs these under a timeout and kills the whole
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
    from minidl.course.pitfalls import TensorPairDataset

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


def fork_lock(method: str, wait: float) -> dict:
    from minidl.course.pitfalls import fork_while_locked

    return fork_while_locked(method, wait)


def main(argv: list[str]) -> None:
    what, args = argv[0], argv[1:]
    if what == "open_files":
        result = open_files(args[0], int(args[1]))
    elif what == "bus_error":
        result = bus_error()
    elif what == "fork_lock":
        result = fork_lock(args[0], float(args[1]))
    else:
        raise SystemExit(f"unknown experiment {what!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
