"""Mistakes the course makes on purpose, as functions and datasets a worker process can import.

A worker started with ``spawn`` or ``forkserver`` (and a ``multiprocessing.Pool``) runs only what it can
import by name, never a notebook cell, so the deliberate mistakes of notebooks 06 and 12 live here.
Experiments that could crash or hang run in a child interpreter (``python -m minidl_course.pitfall_run``)
under a timeout. Nothing else in minidl uses this module, and it mirrors no file of PyTorch.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

from minidl.dataset import Dataset
from minidl.worker import get_worker_info
from minidl_course import osfacts
from minidl_course.cores import core_count

MB = 2**20


def global_draws(n: int = 2) -> tuple[int, dict[str, list[float]]]:
    """This process's pid and ``n`` draws from each global stream a random augmentation might use.

    Python's ``random`` reseeds itself in a forked child; NumPy's and torch's global streams do not,
    so processes forked from one parent, and never reseeded, draw the same numbers from those two.
    """
    draws = {"random": [random.random() for _ in range(n)], "numpy": [float(x) for x in np.random.rand(n)]}
    try:
        import torch
    except ImportError:
        return os.getpid(), draws
    draws["torch"] = [float(x) for x in torch.rand(n)]
    return os.getpid(), draws


def run_child(args: list[str], timeout: float = 60.0, prefix: tuple[str, ...] = (),
              module: str | None = "minidl_course.pitfall_run", cwd: str | None = None,
              env: dict | None = None) -> dict:
    """Run ``python -m module *args`` (by default the pitfalls' child) in a fresh interpreter, at most ``timeout`` s;
    with ``module=None``, ``python *args`` (``args[0]`` a script), in ``cwd`` with ``env`` where given.

    Returns its pid, exit code, whether it timed out, its stdout and stderr, and the JSON it printed last (or
    ``None``). The child runs in its own process group, and the whole group is killed if it overstays, so nothing
    it started outlives it. ``prefix`` goes before the command (``unshare ...``: see ``run_in_namespace``).
    """
    cmd = [*prefix, sys.executable, *(("-m", module) if module else ()), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=cwd, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        timed_out = True
    try:
        os.killpg(proc.pid, 9)  # anything of the group still there (nothing, when all went well)
    except ProcessLookupError:
        pass
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return {"pid": proc.pid, "returncode": proc.returncode, "timed_out": timed_out, "stdout": out, "stderr": err,
            "result": json.loads(lines[-1]) if lines else None}


def run_script(module: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``python -m module`` (one of the course's small scripts) under a timeout; its output comes back."""
    return subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=timeout)


# --- 1. Copy-on-read: Python objects in a forked worker ------------------------------------------------


def file_names(n: int) -> list[str]:
    """``n`` file names, the kind of per-sample metadata a dataset keeps in memory."""
    return [f"train/class_{i % 1000:04d}/img_{i:08d}.jpg" for i in range(n)]


class NameListDataset(Dataset):
    """Keeps its names as a Python list of ``str``: each read bumps a refcount, so a page gets written."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> int:
        return len(self.names[index])  # reading is enough: the str's refcount goes up and down


class NameArrayDataset(NameListDataset):
    """The same names in one NumPy bytes array: one object, and reading a row writes nothing."""

    def __init__(self, names: list[str]) -> None:
        self.names = np.array([s.encode() for s in names])  # fixed-width bytes, one buffer

    def __getitem__(self, index: int) -> int:
        return len(self.names[index])


EPOCH_MARKS = (0.0, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)


def worker_memory_over_epoch(dataset, num_workers: int = 2, batch_size: int = 512,
                             marks: tuple[float, ...] = EPOCH_MARKS, seed: int = 0) -> dict:
    """Iterate one shuffled epoch with forked workers; sample each worker's PSS and USS at ``marks``.

    ``marks`` are fractions of the epoch (denser early, where the growth happens). Returns
    ``{"fraction": [...], "pss": [[MiB at each mark] per worker], "uss": [...]}``; the first sample
    is taken right after the first batch arrives, the last one as the last batch arrives.
    """
    import torch

    from minidl import DataLoader

    if not osfacts.pss():
        raise OSError(f"{osfacts.pss().line()} (check osfacts.pss() first and show the recorded result)")
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                        multiprocessing_context="fork", generator=torch.Generator().manual_seed(seed))
    n_batches = len(loader)
    at = {round(f * (n_batches - 1)) for f in marks}
    fraction, pss, uss = [], [[] for _ in range(num_workers)], [[] for _ in range(num_workers)]
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    for b, _batch in enumerate(it):
        if b in at:
            fraction.append((b + 1) / n_batches)
            for i, pid in enumerate(pids):
                pss[i].append(osfacts.pss_bytes(pid) / MB)
                uss[i].append(osfacts.uss_bytes(pid) / MB)
    del it
    return {"fraction": fraction, "pss": pss, "uss": uss}


# --- 2. Open files and /dev/shm ------------------------------------------------------------------------


class TensorPairDataset(Dataset):
    """``n`` samples of ``(float32 image C x H x W, int label)``, made from the index (no I/O)."""

    def __init__(self, n: int, shape: tuple[int, ...] = (3, 32, 32)) -> None:
        self.n, self.shape = n, tuple(shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        import torch

        if not 0 <= index < self.n:
            raise IndexError(index)
        return torch.full(self.shape, float(index)), index


def shared_fds(pids: list[int]) -> dict[tuple[int, int], int] | None:
    """The shared-memory files the processes ``pids`` hold open: ``{(device, inode): bytes}``; None without /proc.

    torch's default ``file_descriptor`` strategy unlinks each segment at once, so ``ls /dev/shm`` shows
    nothing; the open descriptors in ``/proc/<pid>/fd`` still point at them ("/dev/shm/torch_... (deleted)").
    """
    return osfacts.open_shm_sizes(pids)


def shm_in_flight(num_workers: int = 2, prefetch_factor: int = 2, batch_size: int = 64,
                  shape: tuple[int, ...] = (3, 64, 64), settle: float = 1.0) -> dict:
    """Hold the first batch, let the workers fill every prefetch slot, then count shared memory in use.

    Returns the batch's bytes, how many shared segments the main process and its workers hold
    open, and their total bytes.
    """
    from minidl import DataLoader

    if not osfacts.open_files():
        raise OSError(f"{osfacts.open_files().line()} (check osfacts.open_files() first and show the recorded result)")
    before = shared_fds([os.getpid()])  # segments this process already held (earlier work in the same process)
    loader = DataLoader(TensorPairDataset(batch_size * (num_workers * prefetch_factor + 4), shape),
                        batch_size=batch_size, num_workers=num_workers, prefetch_factor=prefetch_factor,
                        multiprocessing_context="fork")
    it = iter(loader)
    first = next(it)
    time.sleep(settle)  # the workers fill the slots the main process has not yet asked for
    segments = shared_fds([os.getpid()] + [w.pid for w in it._workers])
    segments = {key: size for key, size in segments.items() if key not in before}
    batch_bytes = sum(t.numel() * t.element_size() for t in first)
    del it, first
    return {"batch_bytes": batch_bytes, "segments": len(segments), "shared_bytes": sum(segments.values())}


def torch_bus_error_text() -> list[str]:
    """torch's own bus-error message, read out of its compiled extension (it lives in C++, not Python)."""
    import glob

    import torch

    texts: set[str] = set()
    for lib in glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_python.*")):  # .so, .dylib
        with open(lib, "rb") as f:
            data = f.read()
        at = data.find(b"bus error")
        while at != -1:  # C strings sit between NUL bytes: cut the one around each hit
            start, end = data.rfind(b"\0", 0, at) + 1, data.find(b"\0", at)
            texts.add(data[start:end].decode(errors="replace"))
            at = data.find(b"bus error", end)
    return sorted(texts)


# --- 2b. A full /dev/shm, for real, in a private namespace ---------------------------------------------

NAMESPACE_UNAVAILABLE = "no private namespace on this machine"


def namespace_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command that gives a child its own mount and pid namespaces, or ``None`` if there is none.

    As root, mount and pid namespaces are enough; anyone else also needs a user namespace (``--user
    --map-root-user``), which some kernels and most containers refuse. Inside, the child may mount a small
    ``tmpfs`` over ``/dev/shm`` that only it sees, and kill ``torch_shm_manager`` processes that are only its own.
    """
    if not osfacts.namespaces():
        return None
    unshare = shutil.which("unshare")
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    return (unshare, *user, "--mount", "--pid", "--fork", "--mount-proc")


def run_in_namespace(args: list[str], recorded: dict, timeout: float = 120.0, prefix=namespace_prefix) -> dict:
    """``run_child(args)`` in a private namespace; where that cannot run, ``recorded`` (a committed Linux run).

    Returns ``{"source": "measured" or "recorded", "why": ..., "result": ...}``: a learner's machine without
    namespaces (macOS, most containers, a kernel that forbids user namespaces) still sees the real text,
    labelled as recorded, and the reason.
    """
    command = prefix()
    why = f"{NAMESPACE_UNAVAILABLE} ({osfacts.namespaces().why_not or 'no `unshare`'})"
    if command is not None:
        try:
            run = run_child(args, timeout=timeout, prefix=command)
        except OSError as e:
            why = f"{NAMESPACE_UNAVAILABLE}: {e}"
        else:
            if run["result"] is not None:
                return {"source": "measured", "why": "private mount and pid namespace", "result": run["result"]}
            last = (run["stderr"].strip().splitlines() or ["no output"])[-1]
            why = f"{NAMESPACE_UNAVAILABLE}: {' '.join(command[:1])} said {last!r}"
    return {"source": "recorded", "why": why, "result": recorded}


def error_summary(error: str | None) -> list[str]:
    """The lines of a loader's error a learner reads: the first, and the last exception's line (and any after it)."""
    if error is None:
        return ["no error"]
    lines = [line for line in error.splitlines() if line.strip()]
    raised = [i for i, line in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*: ", line)]  # "RuntimeError: ..."
    last = raised[-1] if raised else 0
    return lines[:1] + (["  ..."] if last > 1 else []) + lines[max(last, 1):]


# Recorded on Linux (2 cores, Python 3.11.7, torch 2.13.0+cpu, Linux), 2026-11-25, by
# ``run_in_namespace(["shm_full", "4"], ...)``; errors shortened with ``error_summary``.
SHM_FULL_RECORDED = {
    "size_mib": 4,
    "batch_bytes": 1573120,
    "torch": {"batches": 2, "of": 8, "error": (
        "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\n  ...\n"
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_4_1447478590_1>: "
        "No space left on device (28)")},
    "minidl": {"batches": 0, "of": 8, "error": (
        "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\n  ...\n"
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_12_2197677462_0>: "
        "No space left on device (28)\nwhile collating sample[0]")},
    "shared_memory": {"returncode": -7, "stdout": "created /dev/shm/psm_ccfb4be1 of 8 MiB; writing...\n",
                      "stderr": "Fatal Python error: Bus error\n"},
}


def shm_full(size_mib: int = 4, timeout: float = 120.0, prefix=namespace_prefix) -> dict:
    """torch's and minidl's loaders (and ``multiprocessing.shared_memory``) with a ``size_mib`` MiB /dev/shm.

    Runs ``pitfall_run.shm_full`` in a private namespace, where a small ``tmpfs`` hides the real /dev/shm;
    where there is none, returns the committed Linux run, labelled ``"recorded"``.
    """
    return run_in_namespace(["shm_full", str(size_mib)], SHM_FULL_RECORDED, timeout, prefix)


# Recorded as above, by ``run_in_namespace(["file_system_leftovers"], ...)``.
LEFTOVERS_RECORDED = {
    "process killed": {"files_held": 8, "managers": 2, "files_left": 0, "seconds": 2.0, "example": []},
    "process and torch_shm_manager killed": {"files_held": 8, "managers": 2, "files_left": 8, "seconds": 10.0,
                                             "example": ["torch_16_1211560494_2"]},
}


def file_system_leftovers(timeout: float = 120.0, prefix=namespace_prefix) -> dict:
    """Under ``file_system``, what a killed process leaves in /dev/shm: with its ``torch_shm_manager``, and without.

    Runs ``pitfall_run.file_system_leftovers`` in a private namespace (its own /dev/shm and pids, so the
    managers it kills are its own); where there is none, the committed Linux run.
    """
    return run_in_namespace(["file_system_leftovers"], LEFTOVERS_RECORDED, timeout, prefix)


# --- 4. Fork while another thread holds a lock ---------------------------------------------------------

_LOCK = threading.Lock()  # module level, like the locks inside logging, malloc or a queue


def _hold_lock(held: threading.Event, release: threading.Event) -> None:
    with _LOCK:
        held.set()
        release.wait()


def use_lock(started) -> None:
    """What the child does first: say it is running, then take the module's lock (as logging would)."""
    started.set()
    with _LOCK:
        pass


def fork_while_locked(method: str, wait: float = 2.0) -> dict:
    """A thread holds ``_LOCK`` while a process is started with ``method``; the child takes the lock.

    Under ``fork`` the child gets a copy of the lock, still locked, and no thread that will ever
    release it: it waits forever. Once the child says it is running, we give it ``wait`` seconds to
    take the lock and finish, then kill it.
    """
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    held, release, started = threading.Event(), threading.Event(), ctx.Event()
    holder = threading.Thread(target=_hold_lock, args=(held, release), daemon=True)
    holder.start()
    held.wait()
    child = ctx.Process(target=use_lock, args=(started,))
    child.start()
    started.wait(60)  # a spawned child must first start an interpreter: that is not the hang
    child.join(wait)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    release.set()
    holder.join()
    return {"method": method, "hung": hung, "exitcode": child.exitcode}


# --- 6. How many workers: one CPU-bound and one waiting pipeline ------------------------------------


class DecodeLikeDataset(Dataset):
    """``(uint8 image H x W x 3, label)`` made from the index by NumPy work (a blur and a flip): CPU-bound."""

    def __init__(self, n: int, size: int = 64, rounds: int = 6) -> None:
        self.n, self.size, self.rounds = n, size, rounds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if not 0 <= index < self.n:
            raise IndexError(index)
        rng = np.random.default_rng(index)
        img = rng.random((self.size, self.size, 3), dtype=np.float32)
        for _ in range(self.rounds):  # a 3x3 box blur, several times: the "decode" work
            img = sum(np.roll(np.roll(img, dy, 0), dx, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / 9
        if index % 2:
            img = img[:, ::-1]
        return (img * 255).astype(np.uint8), index % 10


class WaitingDataset(DecodeLikeDataset):
    """The same samples after a ``delay`` s wait per sample (a disk or network read): mostly idle."""

    def __init__(self, n: int, size: int = 64, delay: float = 0.004) -> None:
        super().__init__(n, size, rounds=0)
        self.delay = delay

    def __getitem__(self, index: int):
        time.sleep(self.delay)
        return super().__getitem__(index)


def train_epoch(dataset, num_workers: int, batch_size: int = 32, trainer=None) -> dict:
    """One epoch of a minidl loader feeding ``Trainer.step``: samples per second, CPU seconds, how busy the cores were.

    ``cores_busy`` is the CPU time of this process and of its workers, over the epoch's wall time times the
    machine's cores (1.0: every core worked all epoch). A worker's CPU time is counted once it has exited and
    been joined (``RUSAGE_CHILDREN``), which the loader does as the epoch ends.

    Workers are forked on Linux, so the epoch times loading rather than interpreters starting. On macOS they start
    by the platform's default (spawn): CPython stopped forking there because a forked child can crash in system
    libraries that run threads, so each epoch there includes its workers' start.
    """
    import resource

    from minidl import DataLoader
    from minidl_course.train import Trainer

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    trainer = trainer or Trainer(channels=3, classes=10, seed=0)
    kwargs = {"multiprocessing_context": "fork"} if num_workers and sys.platform.startswith("linux") else {}
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **kwargs)
    main0, workers0, t0 = time.process_time(), children_cpu(), time.perf_counter()
    for batch in loader:
        trainer.step(batch)
    seconds = time.perf_counter() - t0
    main, workers = time.process_time() - main0, children_cpu() - workers0
    return {"samples_per_s": len(dataset) / seconds, "seconds": seconds, "main_cpu_s": main, "workers_cpu_s": workers,
            "cores_busy": (main + workers) / seconds / core_count()}


def machine_cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds every core has spent busy, and in all, since boot (Linux's ``/proc/stat``; else ``None``).

    Two readings around a measurement tell how busy the whole machine was (everyone's programs, not only ours).
    """
    return osfacts.machine_cpu_seconds()


def train_throughput(dataset, num_workers: int, batch_size: int = 32, trainer=None) -> float:
    """Samples per second through one epoch of a minidl loader feeding ``Trainer.step``."""
    return train_epoch(dataset, num_workers, batch_size, trainer)["samples_per_s"]


# --- 7. persistent_workers -------------------------------------------------------------------------


def epoch_times(persistent: bool, epochs: int = 3, method: str = "spawn", num_workers: int = 2,
                n: int = 64, batch_size: int = 16) -> list[dict]:
    """Per epoch: seconds to the first batch and for the whole epoch, and the workers' pids.

    Without ``persistent_workers`` every epoch starts new workers (new pids); with it, the first
    epoch's workers serve them all.
    """
    from minidl import DataLoader

    loader = DataLoader(TensorPairDataset(n, (3, 16, 16)), batch_size=batch_size, num_workers=num_workers,
                        multiprocessing_context=method, persistent_workers=persistent)
    rows = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        for _ in it:
            pass
        rows.append({"epoch": epoch, "first_batch_s": first, "epoch_s": time.perf_counter() - t0,
                     "worker_pids": [w.pid for w in it._workers]})
    del it, loader
    return rows


# --- 8. An IterableDataset in several workers ------------------------------------------------------


def shard_in_worker_init(worker_id: int) -> None:
    """A ``worker_init_fn`` that narrows this worker's copy of a ``toy.UnshardedRange`` to its own shard."""
    info = get_worker_info()
    ds = info.dataset  # this worker's own copy: changing it changes nothing in the other workers
    per_worker = -(-(ds.end - ds.start) // info.num_workers)
    lo = ds.start + worker_id * per_worker
    ds.start, ds.end = lo, min(lo + per_worker, ds.end)


# --- what a platform without /proc, PSS or file_descriptor shows instead ---------------------------------
# Runs recorded on Linux (AMD EPYC, 2 cores; Python 3.11.7, torch 2.13.0+cpu, Linux), 2026-11-26, by
# the code named with each; a notebook shows them, labelled, where ``osfacts`` says the fact is missing.

# ``worker_memory_over_epoch(cls(file_names(1_000_000)), num_workers=2, batch_size=512)``, MiB.
COPY_ON_READ_RECORDED = {
    "names": 1_000_000,
    "list of str": {
        "fraction": [0.001, 0.011, 0.02, 0.04, 0.071, 0.1, 0.15, 0.201, 0.3, 0.45, 0.6, 0.8, 1.0],
        "pss": [[94.372, 108.126, 117.409, 131.102, 141.767, 147.073, 150.815, 151.945, 152.419, 152.468, 152.54,
                 152.548, 152.547],
                [93.774, 107.376, 117.418, 130.692, 141.759, 146.75, 150.45, 151.604, 152.089, 152.173, 152.243,
                 152.251, 152.254]],
        "uss": [[12.336, 29.238, 41.668, 62.188, 79.863, 89.328, 96.207, 98.438, 99.375, 99.457, 99.531, 99.547,
                 99.559],
                [10.297, 27.723, 41.688, 61.379, 79.758, 88.828, 95.734, 98.012, 98.969, 99.125, 99.191, 99.211,
                 99.23]]},
    "NumPy array": {
        "fraction": [0.001, 0.011, 0.02, 0.04, 0.071, 0.1, 0.15, 0.201, 0.3, 0.45, 0.6, 0.8, 1.0],
        "pss": [[102.436, 102.514, 102.565, 102.718, 102.754, 102.804, 102.79, 102.864, 102.91, 102.956, 102.963,
                 103.039, 103.123],
                [102.362, 102.503, 102.554, 102.612, 102.658, 102.735, 102.712, 102.79, 102.822, 102.875, 102.887,
                 102.959, 103.036]],
        "uss": [[6.25, 6.348, 6.43, 6.574, 6.719, 6.859, 6.883, 7.023, 7.086, 7.176, 7.184, 7.211, 7.234],
                [6.039, 6.195, 6.277, 6.43, 6.574, 6.723, 6.727, 6.875, 6.918, 7.012, 7.039, 7.059, 7.066]]},
}

_TOO_MANY = ("RuntimeError: Too many open files. Communication with the workers is no longer possible. Please "
             "increase the limit using `ulimit -n` in the shell or change the sharing strategy by calling "
             "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code")
# ``run_child(["open_files", "file_descriptor", "128"])``.
OPEN_FILES_RECORDED = {"torch": {"kept": 56, "error": _TOO_MANY}, "minidl": {"kept": 56, "error": _TOO_MANY}}

# ``shm_in_flight(num_workers, prefetch_factor, batch_size=32, shape=(3, 128, 128))``, by (workers, prefetch).
SHM_IN_FLIGHT_RECORDED = {
    (2, 2): {"batch_bytes": 6291712, "segments": 10, "shared_bytes": 31458560},
    (2, 4): {"batch_bytes": 6291712, "segments": 18, "shared_bytes": 56625408},
    (4, 2): {"batch_bytes": 6291712, "segments": 18, "shared_bytes": 56625408},
}


def open_files_run(strategy: str, nofile: int = 128, timeout: float = 120.0) -> dict:
    """``pitfall_run.open_files`` in a child, under torch's sharing ``strategy`` and ``ulimit -n nofile``.

    Returns ``{"source": "measured" or "recorded", "why": ..., "result": {library: {"kept", "error"}}}``: where
    torch does not offer ``strategy`` here (a Mac has only ``file_system``), the committed Linux run.
    """
    fact = osfacts.sharing_strategy(strategy)
    if not fact:
        return {"source": "recorded", "why": fact.why_not, "result": OPEN_FILES_RECORDED}
    return {"source": "measured", "why": f"torch offers {strategy!r} here",
            "result": run_child(["open_files", strategy, str(nofile)], timeout=timeout)["result"]}
