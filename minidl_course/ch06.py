"""Notebook 06's worker deaths: torch's runs happen in a child interpreter, so a hang costs seconds, not the kernel.

torch 2.13 can hang when a worker is killed: now and then its iterator keeps waiting for a batch the dead
worker held, while the surviving workers wait for work. ``torch_death`` and ``torch_after_death`` run torch's
``DataLoader`` in ``python -m minidl_course.ch06 ...``; a watchdog thread there kills the child's whole process
group (the child and its workers) once ``hang_s`` seconds pass with no batch and no error (the workers' start-up,
seconds under ``spawn`` on a busy machine, gets ``STARTUP_S``), and the result says so. minidl's deaths run in
this process through ``die``: its loader reports a dead worker by design.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from minidl_course.crash import DiesInWorker
from minidl_course.pitfalls import run_child as run_child_process

TORCH_OUTER = "DataLoader worker (pid(s) <pid>) exited unexpectedly"  # torch 2.13's message, pids hidden
# The words of torch's signal handler for one dead worker (its C++ message, which the outer one wraps as the cause).
TORCH_HANDLER = ("DataLoader worker (pid <pid>) is killed by signal: ",
                 "DataLoader worker (pid <pid>) exited unexpectedly with exit code ")
HANG_S = 20.0  # seconds with no batch and no error: far above torch's 5 s status check
STARTUP_S = 120.0  # for the child to import torch and start its workers, before the first batch


def die(loader_cls: Any, how: str, context: str | None = None,
        on_batch: Callable[[], None] | None = None) -> tuple[BaseException, list, float]:
    """Iterate ``DiesInWorker(20, bad_index=6, how=how)`` in batches of 2 over 2 workers until the loader raises.

    Returns the exception, the batches before it (how many depends on timing) and the seconds from the first
    batch (the workers are up by then; a spawned one takes seconds to start) to the exception. ``on_batch`` is
    called after each batch (the child's watchdog counts from there).
    """
    received, start = [], time.perf_counter()
    try:
        for batch in loader_cls(DiesInWorker(20, bad_index=6, how=how), batch_size=2, num_workers=2,
                                multiprocessing_context=context):
            if not received:
                start = time.perf_counter()
            received.append(batch.tolist())
            if on_batch is not None:
                on_batch()
    except Exception as error:  # noqa: BLE001 -- which exception escapes is what the lesson looks at
        return error, received, time.perf_counter() - start
    raise AssertionError("the worker did not die")


def no_pids(text: object) -> str:
    """``text`` with every pid replaced by ``<pid>`` (pids change every run).

    >>> no_pids("DataLoader worker (pid(s) 123, 456) exited; pid 789")
    'DataLoader worker (pid(s) <pid>) exited; pid <pid>'
    """
    return re.sub(r"pid(\(s\))? \d+(, \d+)*", lambda m: f"pid{m.group(1) or ''} <pid>", str(text))


def as_designed(error: BaseException) -> bool:
    """torch's designed report: the wait loop caught the SIGCHLD handler's RuntimeError and raised its own from it."""
    return isinstance(error, RuntimeError) and isinstance(error.__cause__, RuntimeError)


# --- the parent's side -----------------------------------------------------------------------------------


def run_child(args: list[str], hang_s: float = HANG_S, startup_s: float = STARTUP_S) -> dict:
    """Run ``python -m minidl_course.ch06 *args`` under the child's watchdog; return what it printed.

    The watchdog allows ``startup_s`` to the first batch, then ``hang_s`` from each batch to the next event.
    ``lines``: every JSON line it printed, in order (a hung child's last one is ``{"hung": seconds}``);
    ``hung``: whether the watchdog (or, failing it, this call's own timeout) stopped it; a child that fails
    otherwise raises ``RuntimeError`` with its stderr;
    ``pid``: the child's, which is also its process group's id.
    The child runs through ``pitfalls.run_child``, which kills whatever is left of its process group afterwards,
    so no worker outlives the call.
    """
    # The child's own watchdog ends it first; this timeout allows for the interpreter's start before the watchdog's.
    run = run_child_process([*args, str(hang_s), str(startup_s)], timeout=60 + startup_s + 2 * hang_s,
                            module="minidl_course.ch06")
    lines = [json.loads(line) for line in run["stdout"].splitlines() if line.startswith("{")]
    hung = run["timed_out"] or bool(lines) and "hung" in lines[-1]
    if not hung and (run["returncode"] != 0 or not lines):  # a broken child is a bug here, not torch's race
        raise RuntimeError(f"python -m minidl_course.ch06 {' '.join(args)} failed ({run['returncode']}): "
                           f"{run['stderr'][-2000:]}")
    return {"lines": lines, "hung": hung, "pid": run["pid"], "returncode": run["returncode"],
            "stderr": run["stderr"][-2000:]}


def torch_death(how: str, context: str, tries: int = 10, hang_s: float = HANG_S) -> dict:
    """Kill a worker of torch's DataLoader (``how``: ``"sigkill"`` or ``"exit"``) until torch reports it as designed.

    Each try runs in a child interpreter (``run_child``). torch sometimes loses a race and another exception
    escapes, or hangs: such a try is counted in ``others`` (its exception's type and message, or ``"hung"``)
    and the next one starts. ``designed``: the report (type, message, cause, seconds), or None if none came.
    """
    others = []
    for _ in range(tries):
        run = run_child(["death", how, context], hang_s=hang_s)
        if run["hung"]:
            others.append({"type": "hung", "message": f"no answer in {hang_s:g} s: child and workers killed"})
            continue
        result = run["lines"][-1]
        if result["as_designed"]:
            return {"designed": result, "others": others}
        others.append(result)
    return {"designed": None, "others": others}


def torch_after_death(context: str, hang_s: float = HANG_S) -> dict:
    """Call ``next()`` on torch's iterator until ``StopIteration`` after worker 1 is SIGKILLed, in a child.

    ``got``: each batch's first sample, or the exception's type name; ``alive_after_error``: how many of
    torch's workers still ran just after the first exception; ``hung``: whether the watchdog had to stop it.
    """
    run = run_child(["after", "sigkill", context], hang_s=hang_s)
    got = [line["got"] for line in run["lines"] if "got" in line]
    alive = [line["alive"] for line in run["lines"] if "alive" in line]
    return {"got": got, "alive_after_error": alive[0] if alive else None, "hung": run["hung"]}


# --- the child's side --------------------------------------------------------------------------------------


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class _Watchdog:
    """Kills this process group, saying so first, when the deadline passes: a hung torch iterator ends here.

    The first deadline is ``startup_s`` away; ``rearm()`` (after each batch) moves it ``hang_s`` from now.
    """

    def __init__(self, hang_s: float, startup_s: float) -> None:
        self.hang_s = hang_s
        self.deadline = time.monotonic() + startup_s
        threading.Thread(target=self._watch, daemon=True).start()

    def rearm(self) -> None:
        self.deadline = time.monotonic() + self.hang_s

    def _watch(self) -> None:
        while time.monotonic() < self.deadline:
            time.sleep(0.05)
        _emit(hung=self.hang_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _child_death(how: str, context: str, watchdog: _Watchdog) -> None:
    import torch.utils.data as tud

    error, _received, took = die(tud.DataLoader, how, context, on_batch=watchdog.rearm)
    cause = error.__cause__
    _emit(type=type(error).__name__, message=no_pids(error), as_designed=as_designed(error), took=took,
          cause_type=type(cause).__name__ if cause else None, cause=no_pids(cause) if cause else None)


def _child_after(how: str, context: str, watchdog: _Watchdog) -> None:
    import torch.utils.data as tud

    it = iter(tud.DataLoader(DiesInWorker(20, bad_index=6, how=how), batch_size=2, num_workers=2,
                             multiprocessing_context=context))
    first_error = True
    while True:
        try:
            _emit(got=next(it)[0].item())
            watchdog.rearm()
        except StopIteration:
            break
        except Exception as error:  # noqa: BLE001 -- whatever escapes is noted, then next() is called again
            _emit(got=type(error).__name__)
            watchdog.rearm()
            if first_error:
                _emit(alive=sum(w.is_alive() for w in it._workers))
                first_error = False
    del it


if __name__ == "__main__":
    command, how, context, hang, startup = sys.argv[1:6]
    {"death": _child_death, "after": _child_after}[command](how, context, _Watchdog(float(hang), float(startup)))
