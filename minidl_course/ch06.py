"""Notebook 06's killed workers: one demonstration, run the same way for both loaders, whose every ending is a result.

``after_death`` iterates ``DiesInWorker(20, bad_index=6, how=how)`` (10 batches of 2, worker 1 dies fetching
sample 6) over 2 workers, calling ``next()`` until ``StopIteration`` or until ``MAX_ERRORS`` calls in a row
have raised, and returns an ``Outcome``: each exception's type and first line, the batches had and lost, how
many of the loader's worker processes still ran just after the first exception, whether it hung. Then it
makes sure none of the processes it started is left running.

What torch 2.13 does there is a race (notebook 06, section 6): its designed ``RuntimeError``, the signal
handler's error alone, an error from the batch's file-descriptor hand-over (``ConnectionResetError``,
``EOFError``), more batches lost than the dead worker held, or a hang. So torch runs in a child interpreter
(``python -m minidl_course.ch06``): there a watchdog ends the child and its workers when no batch and no error
has come for ``hang_s`` seconds, and the outcome says it hung; the child's process group is killed after it in
any case. minidl runs in the calling process: its loader reports a dead worker the same way every time.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from minidl_course.crash import DiesInWorker
from minidl_course.pitfalls import run_child as run_child_process

TORCH_OUTER = "DataLoader worker (pid(s) <pid>) exited unexpectedly"  # torch 2.13's message, pids hidden
# The words of torch's signal handler for one dead worker (its C++ message, which the outer one wraps as the cause).
TORCH_HANDLER = ("DataLoader worker (pid <pid>) is killed by signal: ",
                 "DataLoader worker (pid <pid>) exited unexpectedly with exit code ")
SAMPLES, BAD_INDEX, BATCH_SIZE, NUM_WORKERS = 20, 6, 2, 2  # batch 3 (samples 6 and 7) is worker 1's
FIRSTS = list(range(0, SAMPLES, BATCH_SIZE))  # each batch named by its first sample
MAX_ERRORS = 4  # next() calls in a row that raise before the demonstration stops asking (minidl raises on each)
HANG_S = 20.0  # seconds with no batch and no error: far above torch's 5 s status check
STARTUP_S = 120.0  # for the child to import torch and start its workers, before the first batch
GRACE_S = 10.0  # for the loader's workers to exit once its iterator is gone, before they are killed
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch_shm_manager")  # kept for life


def no_pids(text: object) -> str:
    """``text`` with every pid replaced by ``<pid>`` (pids change every run).

    >>> no_pids("DataLoader worker (pid(s) 123, 456) exited; pid 789")
    'DataLoader worker (pid(s) <pid>) exited; pid <pid>'
    """
    return re.sub(r"pid(\(s\))? \d+(, \d+)*", lambda m: f"pid{m.group(1) or ''} <pid>", str(text))


def first_line(error: BaseException | None) -> str | None:
    """``"Type: first line of the message"``, pids hidden; None for None.

    >>> first_line(KeyError("bad sample 5")), first_line(ConnectionResetError(104, "Connection reset by peer"))
    ("KeyError: 'bad sample 5'", 'ConnectionResetError: [Errno 104] Connection reset by peer')
    """
    if error is None:
        return None
    lines = no_pids(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def as_designed(error: BaseException) -> bool:
    """torch's designed report: the wait loop caught the SIGCHLD handler's RuntimeError and raised its own from it."""
    return isinstance(error, RuntimeError) and isinstance(error.__cause__, RuntimeError)


@dataclass
class Outcome:
    """What one loader did after one of its workers died, as ``after_death`` saw it."""

    library: str
    how: str
    had: list[int] = field(default_factory=list)  # the batches received, in order, each by its first sample
    errors: list[str] = field(default_factory=list)  # each exception next() raised: "Type: first line"
    cause: str | None = None  # the first exception's cause, "Type: first line", if it had one
    took: float | None = None  # seconds from the first batch to the first exception (None: it came before any)
    had_before: int | None = None  # batches received before the first exception
    workers_alive: list[int] = field(default_factory=list)  # the loader's worker processes running just after each
    ended: str = ""  # "StopIteration", "raised on every next()", or "hung"
    killed: int = 0  # processes of the loader still running afterwards, which the demonstration killed

    @property
    def workers_left(self) -> int | None:
        """The loader's worker processes still running just after the first exception (None: there was none)."""
        return self.workers_alive[0] if self.workers_alive else None

    @property
    def hung(self) -> bool:
        return self.ended == "hung"

    @property
    def noticed(self) -> str:
        """When the first exception came, in words."""
        if not self.errors:
            return "no exception"
        return "before the first batch" if self.took is None else f"{self.took:.2f} s after the first batch"

    @property
    def lost(self) -> list[int]:
        """The batches that never came, each by its first sample."""
        return [first for first in FIRSTS if first not in self.had]

    @property
    def kind(self) -> str:
        """The outcome in a few words, pids, timings and batch counts before the error aside: what is counted.

        torch's own messages are named by who raised them: its SIGCHLD handler, or its wait loop (which chains the
        handler's error, or finds the dead worker at a status check).

        >>> Outcome("torch", "sigkill", had=[0, 2, 4, 8], errors=["RuntimeError: x"], ended="StopIteration").kind
        'RuntimeError, then StopIteration, 6 batches lost'
        >>> Outcome("torch", "exit", errors=[f"RuntimeError: {TORCH_OUTER}"], ended="hung",
        ...         cause="RuntimeError: " + TORCH_HANDLER[1] + "3.").kind
        "the wait loop's RuntimeError from the handler's RuntimeError, then hung"
        >>> Outcome("minidl", "exit", errors=["RuntimeError: x"] * 4, cause="RuntimeError: x",
        ...         ended="raised on every next()").kind
        'RuntimeError, then raised on every next()'
        """
        if not self.errors:
            error = "no exception"
        else:
            named = list(dict.fromkeys(map(self._named, self.errors)))
            error = named[0]
            if self.cause and self.cause != self.errors[0]:
                error += f" from {self._named(self.cause)}"
            error += "".join(f", then {other}" for other in named[1:])
        lost = f", {_batches(len(self.lost))} lost" if self.ended == "StopIteration" else ""
        return f"{error}, then {self.ended}{lost}"

    def _named(self, line: str) -> str:
        if self.library == "torch" and line.startswith(f"RuntimeError: {TORCH_OUTER}"):
            return "the wait loop's RuntimeError"
        if self.library == "torch" and line.startswith(tuple(f"RuntimeError: {h}" for h in TORCH_HANDLER)):
            return "the handler's RuntimeError"
        return line.split(":")[0]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost": self.lost, "kind": self.kind}

    def __str__(self) -> str:
        lines = [f'{self.library}, how="{self.how}": ' + (
            f"after {_batches(self.had_before)} next() raised {self.errors[0]}" if self.errors
            else f"no exception in {_batches(len(self.had))}")]
        if self.cause and self.cause != self.errors[0]:
            lines.append(f"    caused by {self.cause}")
        if self.errors:
            lines.append(f"    {self.noticed}; worker processes still running just after: {self.workers_left}")
        if self.hung:
            lines.append(f"    then no batch and no error for {HANG_S:g} s: it hung, and the watchdog killed the child "
                         "interpreter and its workers")
        elif self.ended == "StopIteration":
            lines.append(f"    then next() went on to StopIteration ({len(self.errors)} exception"
                         f"{'s' * (len(self.errors) != 1)} in all)")
        else:
            lines.append(f"    then each of {len(self.errors) - 1} more next() calls raised "
                         + ("the same again" if len(set(self.errors)) == 1 else "; ".join(self.errors[1:])))
        lost = ", ".join(map(str, self.lost)) or "none"
        lines.append(f"    batches had: {len(self.had)} of {len(FIRSTS)}; lost (by first sample): {lost}")
        if self.killed:
            lines.append(f"    {self.killed} of its processes still ran afterwards: killed")
        return "\n".join(lines)


def _batches(n: int) -> str:
    return f"{n} batch" + "es" * (n != 1)


# --- the demonstration, run where the loader runs (the notebook's process for minidl, a child for torch) ------


def _new_processes(before: set[int]) -> list[psutil.Process]:
    """This process's live descendants not in ``before``, long-lived helpers aside: a loader's workers."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in before or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(helper in " ".join(proc.cmdline()) for helper in HELPERS):
                continue
            found.append(proc)
        except psutil.Error:
            continue  # gone while we looked
    return found


def after_death(loader_cls: Any, how: str, context: str | None, library: str,
                on_event: Callable[[dict], None] = lambda event: None) -> Outcome:
    """Kill worker 1 (``how``: ``"sigkill"`` or ``"exit"``), call ``next()`` to the end, and say what came.

    Every exception is recorded, whether ``next()`` raised it or a ``SIGCHLD`` handler raised it between two
    lines of this function (both loaders' handlers raise wherever the main thread is). ``on_event`` gets each
    step as a dict (the child passes it on to the parent, and re-arms its watchdog). Afterwards any of the
    loader's processes still running after ``GRACE_S`` is killed, and counted in ``killed``.
    """
    outcome = Outcome(library, how)
    before = {proc.pid for proc in psutil.Process().children(recursive=True)}
    started = [None]  # when the first batch came

    def record_error(error: BaseException) -> None:
        if not outcome.errors:
            outcome.had_before = len(outcome.had)
            outcome.cause = first_line(error.__cause__)
            outcome.took = None if started[0] is None else time.perf_counter() - started[0]
        outcome.workers_alive.append(len(_new_processes(before)))
        outcome.errors.append(first_line(error))
        on_event({"error": outcome.errors[-1], "cause": outcome.cause, "took": outcome.took,
                  "alive": outcome.workers_alive[-1], "had_before": outcome.had_before})

    def drive(it) -> str:
        while in_a_row[0] < MAX_ERRORS:
            try:
                batch = next(it)
            except StopIteration:
                return "StopIteration"
            except Exception as error:  # noqa: BLE001 -- whatever escapes is the lesson; next() is called again
                in_a_row[0] += 1
                record_error(error)
                continue
            in_a_row[0] = 0
            started[0] = started[0] or time.perf_counter()
            outcome.had.append(int(batch[0]))
            on_event({"batch": outcome.had[-1]})
        return "raised on every next()"

    in_a_row = [0]  # next() calls in a row that raised
    it = iter(loader_cls(DiesInWorker(SAMPLES, bad_index=BAD_INDEX, how=how), batch_size=BATCH_SIZE,
                         num_workers=NUM_WORKERS, multiprocessing_context=context))
    while not outcome.ended:
        try:
            outcome.ended = drive(it)
        except Exception as late:  # noqa: BLE001 -- a SIGCHLD handler raised between two lines above, not in next()
            in_a_row[0] += 1
            record_error(late)
    del it
    gc.collect()
    outcome.killed = _clean_up(before)
    return outcome


def _clean_up(before: set[int]) -> int:
    """Wait up to ``GRACE_S`` for the processes started since ``before`` to exit; kill the rest; how many."""
    deadline = time.monotonic() + GRACE_S
    while (left := _new_processes(before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:
        try:
            proc.kill()
            proc.wait(5)
        except psutil.Error:
            continue
    return len(left)


def minidl_after_death(how: str, context: str | None) -> Outcome:
    """``after_death`` with minidl's DataLoader, in this process."""
    import minidl

    return after_death(minidl.DataLoader, how, context, "minidl")


# --- torch's, in a child interpreter ---------------------------------------------------------------------


def torch_after_death(context: str, hows: tuple[str, ...] = ("sigkill", "exit"), hang_s: float = HANG_S,
                      startup_s: float = STARTUP_S) -> dict[str, Outcome]:
    """``after_death`` with torch's DataLoader for each of ``hows``, in a child interpreter: ``{how: Outcome}``.

    A child that hangs is killed with its workers by its watchdog; that outcome says so, and a new child runs
    the ``hows`` still to come.
    """
    outcomes: dict[str, Outcome] = {}
    while len(outcomes) < len(hows):
        todo = [how for how in hows if how not in outcomes]
        run = run_child(["after", context, *todo], hang_s=hang_s, startup_s=startup_s)
        for how in todo:
            events = [line for line in run["lines"] if line.get("how") == how]
            finished = next((event["outcome"] for event in events if "outcome" in event), None)
            if finished is not None:
                outcomes[how] = Outcome(**finished)
                continue
            if not run["hung"]:
                raise RuntimeError(f"python -m minidl_course.ch06 after {context} {' '.join(todo)} stopped before "
                                   f"{how} ({run['returncode']}): {run['stderr'][-2000:]}")
            outcomes[how] = _hung(how, events)  # the one the watchdog stopped; a new child runs the rest
            break
    return {how: outcomes[how] for how in hows}


def _hung(how: str, events: list[dict]) -> Outcome:
    """torch's outcome put together from the events a child printed before its watchdog killed it."""
    outcome = Outcome("torch", how, ended="hung")
    for event in events:
        if "batch" in event:
            outcome.had.append(event["batch"])
        elif "error" in event:
            if not outcome.errors:
                outcome.cause, outcome.took, outcome.had_before = event["cause"], event["took"], event["had_before"]
            outcome.workers_alive.append(event["alive"])
            outcome.errors.append(event["error"])
    return outcome


def run_child(args: list[str], hang_s: float = HANG_S, startup_s: float = STARTUP_S) -> dict:
    """Run ``python -m minidl_course.ch06 *args`` under the child's watchdog; return what it printed.

    The watchdog allows ``startup_s`` to the first batch, then ``hang_s`` from each event to the next.
    ``lines``: every JSON line it printed, in order (a hung child's last one is ``{"hung": seconds}``);
    ``hung``: whether the watchdog (or, failing it, this call's own timeout) stopped it; a child that fails
    otherwise raises ``RuntimeError`` with its stderr; ``pid``: the child's, which is also its process group's id.
    The child runs through ``pitfalls.run_child``, which kills whatever is left of its process group afterwards,
    so no worker outlives the call.
    """
    # The child's own watchdog ends it first; this timeout allows for the interpreter's start before the watchdog's.
    run = run_child_process([args[0], str(hang_s), str(startup_s), *args[1:]],
                            timeout=60 + startup_s + 4 * hang_s, module="minidl_course.ch06")
    lines = [json.loads(line) for line in run["stdout"].splitlines() if line.startswith("{")]
    hung = run["timed_out"] or bool(lines) and "hung" in lines[-1]
    if not hung and (run["returncode"] != 0 or not lines):  # a broken child is a bug here, not torch's race
        raise RuntimeError(f"python -m minidl_course.ch06 {' '.join(args)} failed ({run['returncode']}): "
                           f"{run['stderr'][-2000:]}")
    return {"lines": lines, "hung": hung, "pid": run["pid"], "returncode": run["returncode"],
            "stderr": run["stderr"][-2000:]}


# --- the child's side --------------------------------------------------------------------------------------


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class _Watchdog:
    """Kills this process group, saying so first, when the deadline passes: a hung torch iterator ends here.

    The first deadline is ``startup_s`` away; ``rearm()`` (after each event) moves it ``hang_s`` from now.
    """

    def __init__(self, hang_s: float, startup_s: float) -> None:
        self.hang_s, self.startup_s = hang_s, startup_s
        self.deadline = time.monotonic() + startup_s
        threading.Thread(target=self._watch, daemon=True).start()

    def rearm(self, startup: bool = False) -> None:
        self.deadline = time.monotonic() + (self.startup_s if startup else self.hang_s)

    def _watch(self) -> None:
        while time.monotonic() < self.deadline:
            time.sleep(0.05)
        _emit(hung=self.hang_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _child_after(context: str, hows: list[str], watchdog: _Watchdog) -> None:
    import torch.utils.data as tud

    for how in hows:
        watchdog.rearm(startup=True)  # each demonstration starts its own workers

        def on_event(event: dict, how: str = how) -> None:
            _emit(how=how, **event)
            watchdog.rearm()

        outcome = asdict(after_death(tud.DataLoader, how, context, "torch", on_event))
        for _ in range(3):  # a late SIGCHLD handler's error would interrupt the print: print it again
            try:
                _emit(how=how, outcome=outcome)
                break
            except Exception:  # noqa: BLE001, S112
                continue


if __name__ == "__main__":
    command, hang, startup, context, *hows = sys.argv[1:]
    {"after": _child_after}[command](context, hows, _Watchdog(float(hang), float(startup)))
