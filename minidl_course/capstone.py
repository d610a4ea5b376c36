"""Notebook 13's harness: runs examples/train_photos.py as a learner runs training, and tunes it one lever at a time.

A run is a child process, ``python examples/train_photos.py FLAGS``, whose printed epochs are read back. A lever
tries its settings on top of the best configuration so far and keeps the fastest when it saves at least
``KEEP_GAIN`` of the run's time. Each setting is shown as its flags, as the lines of a training script it changes
(a diff), and as its measured effect. The notebook's cells make one call each and print what comes back.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minidl_course import accelerators

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_photos.py"
KEEP_GAIN = 0.05  # a change kept must save this share of the run's time: less is within a busy machine's noise
QUICK_SETTINGS = ("--epochs", "2", "--limit", "32", "--size", "64")  # MINIDL_QUICK: a short run of small crops

# The script's levers, by torch's names, at the script's defaults. "torch_threads" is torch.set_num_threads;
# "batched_fetch" is the BatchedPhotos dataset with collate_fn=as_is; worker_method="thread" is minidl's only.
DEFAULTS: dict[str, Any] = {"num_workers": 0, "batch_size": 32, "batched_fetch": False, "persistent_workers": False,
                            "prefetch_factor": None, "multiprocessing_context": None,
                            "worker_method": "multiprocessing", "torch_threads": None, "pin_memory": False}
NEEDS_WORKERS = ("persistent_workers", "prefetch_factor", "multiprocessing_context", "worker_method")
EPOCH_LINE = re.compile(r"^epoch (\d+): ([\d.]+) s, waiting for data ([\d.]+)%", re.MULTILINE)


# The script's flags: those that take a value, and the switches with the value each one sets.
VALUE_FLAGS = {"--num-workers": "num_workers", "--batch-size": "batch_size", "--prefetch-factor": "prefetch_factor",
               "--start-method": "multiprocessing_context", "--torch-threads": "torch_threads"}
SWITCHES = {"--batched-fetch": ("batched_fetch", True), "--persistent-workers": ("persistent_workers", True),
            "--pin-memory": ("pin_memory", True), "--thread-workers": ("worker_method", "thread")}


def flags(config: dict) -> list[str]:
    """The script's command-line flags for ``config`` (a dict of the levers that differ from ``DEFAULTS``)."""
    c = {**DEFAULTS, **config}
    out = []
    for flag, name in VALUE_FLAGS.items():
        if c[name] != DEFAULTS[name]:
            out += [flag, str(c[name])]
    return out + [flag for flag, (name, value) in SWITCHES.items() if c[name] == value]


def config_from_flags(words: list[str]) -> dict:
    """The levers a list of the script's flags sets: ``flags``'s inverse.

    >>> config_from_flags(["--num-workers", "2", "--persistent-workers", "--start-method", "spawn"])
    {'num_workers': 2, 'persistent_workers': True, 'multiprocessing_context': 'spawn'}
    """
    config, words = {}, list(words)
    while words:
        flag = words.pop(0)
        if flag in SWITCHES:
            name, value = SWITCHES[flag]
            config[name] = value
        else:
            value = words.pop(0)
            config[VALUE_FLAGS[flag]] = value if flag == "--start-method" else int(value)
    return config


def code(config: dict) -> list[str]:
    """The lines of a training script that ``config`` sets: its dataset, its DataLoader, its copy to the device."""
    c = {**DEFAULTS, **config}
    lines = [f"torch.set_num_threads({c['torch_threads']})"] if c["torch_threads"] else []
    lines.append(f"photos = {'BatchedPhotos' if c['batched_fetch'] else 'Photos'}(folder, size)")
    args = [f"batch_size={c['batch_size']}", "shuffle=True"]
    args += [f"{name}={c[name]!r}" for name in ("num_workers", "persistent_workers", "prefetch_factor",
                                                "multiprocessing_context", "pin_memory") if c[name] != DEFAULTS[name]]
    if c["batched_fetch"]:
        args.append("collate_fn=as_is")
    if c["worker_method"] == "thread":
        args.append("worker_method='thread'")
    loader = "minidl.DataLoader" if c["worker_method"] == "thread" else "DataLoader"
    lines.append(f"loader = {loader}(photos, {', '.join(args)})")
    lines.append("images = images.to(device, non_blocking=True)" if c["pin_memory"] else "images = images.to(device)")
    return lines


def diff(old: dict, new: dict) -> list[str]:
    """The script's lines ``new`` changes from ``old``, as a unified diff's ``-`` and ``+`` lines."""
    before, after = code(old), code(new)
    return [f"- {line}" for line in before if line not in after] + [f"+ {line}" for line in after if line not in before]


def forkserver_preloads_main(version: tuple[int, ...] | None = None) -> bool:
    """Whether this Python's forkserver imports the main script once, in its server, as its default preload says.

    The ``'__main__'`` preload read a key that ``spawn.get_preparation_data()`` stopped providing in 2013, so the
    server imported nothing and every worker imported the script itself; CPython 3.13.8 and 3.14.1 fixed it.

    >>> [forkserver_preloads_main(v) for v in ((3, 11, 7), (3, 13, 8), (3, 14, 0), (3, 14, 1))]
    [False, True, False, True]
    """
    v = tuple(version or sys.version_info[:3])
    return (3, 13, 8) <= v < (3, 14, 0) or v >= (3, 14, 1)


def training_device() -> str:
    """Where this machine can train: the accelerator torch finds if a tensor can be made there, else ``"cpu"``."""
    import torch

    kind = accelerators.accelerator()
    if kind != "cpu":
        try:
            torch.empty(1, device=kind)
        except (RuntimeError, AssertionError):  # named but not usable (the Mac stand-in's "mps")
            return "cpu"
    return kind


def torch_threads() -> int:
    """The threads torch's intra-op pool has when not told (the script's step, unless --torch-threads says)."""
    import torch

    return torch.get_num_threads()


def script_default_device() -> str:
    """The device the script picks when not told (its ``--device`` default)."""
    import torch

    return str(torch.accelerator.current_accelerator()) if torch.accelerator.is_available() else "cpu"


@dataclass
class Run:
    """One run of the script: its configuration, what it printed, and each epoch's time and waiting share."""

    config: dict
    output: str
    epochs: list[float]
    waiting: list[float]  # each epoch's share (0 to 1) spent waiting for data

    @property
    def per_epoch(self) -> float:
        """Seconds an epoch after the first (the first pays for starting the workers, when they persist)."""
        later = self.epochs[1:] or self.epochs
        return sum(later) / len(later)

    @property
    def waiting_share(self) -> float:
        later = self.waiting[1:] or self.waiting
        return sum(later) / len(later)

    @property
    def total(self) -> float:
        """The run's training time: every epoch's, the first included."""
        return sum(self.epochs)

    def line(self, label: str) -> str:
        return (f"{label:<40} first epoch {self.epochs[0]:6.2f} s, then {self.per_epoch:6.2f} s an epoch, "
                f"waiting for data {self.waiting_share:4.0%}")


def run_script(config: dict, settings: tuple[str, ...] = (), trace: str | None = None, timeout: float = 600) -> Run:
    """Run the script as a learner would, with ``config``'s flags after ``settings``; its epochs read back."""
    command = [sys.executable, str(SCRIPT), *settings, *flags(config)] + (["--trace", trace] if trace else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=SCRIPT.parents[1])
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    found = EPOCH_LINE.findall(done.stdout)
    return Run(dict(config), done.stdout, [float(s) for _, s, _ in found], [float(w) / 100 for _, _, w in found])


@dataclass
class Step:
    """One lever: the run it started from, the runs it tried, and the one kept (``None``: none saved enough)."""

    lever: str
    before: Run
    tried: list[Run]
    kept: Run | None
    note: str = ""

    @property
    def best(self) -> Run:
        return min(self.tried, key=lambda r: r.total)

    def saving(self, run: Run) -> float:
        """The share of the run's time ``run`` saves over the run this lever started from (negative: it cost)."""
        return 1 - run.total / self.before.total

    def __str__(self) -> str:
        out = [f"{self.lever}, on top of: {command(self.before.config)}", self.before.line("  now")]
        out += [r.line("  " + label(self.before.config, r.config)) for r in self.tried]
        if any(name in changed(self.before.config, r.config) for r in self.tried for name in NEEDS_WORKERS) and \
                self.before.config.get("num_workers", 0) == 0:
            out.append("  (--num-workers added: this lever needs workers, and none were kept)")
        if self.note:
            out.append(self.note)
        best = self.best
        if self.kept is None:
            out.append(f"not kept: the fastest, {label(self.before.config, best.config)}, "
                       f"{'saved' if self.saving(best) >= 0 else 'cost'} {abs(self.saving(best)):.0%} of the run's "
                       f"time (a change kept must save {KEEP_GAIN:.0%})")
        else:
            out.append(f"kept: {self.saving(best):.0%} of the run's time saved")
            out += diff(self.before.config, best.config)
            out.append(f"an epoch: {self.before.per_epoch:.2f} s -> {best.per_epoch:.2f} s "
                       f"(x{self.before.per_epoch / best.per_epoch:.2f}); waiting for data: "
                       f"{self.before.waiting_share:.0%} -> {best.waiting_share:.0%}")
        return "\n".join(out)


def changed(old: dict, new: dict) -> dict:
    """The levers ``new`` sets differently from ``old``."""
    return {k: v for k, v in new.items() if old.get(k, DEFAULTS[k]) != v}


def label(old: dict, new: dict) -> str:
    """The flags that take ``old`` to ``new``; a try that changes nothing (the default, named) says so."""
    return " ".join(flags(changed(old, new))) or "(no change: the default)"


def command(config: dict) -> str:
    return " ".join(["python examples/train_photos.py", *flags(config)])


@dataclass
class Tuning:
    """The script tuned lever by lever from its defaults: ``start()``, then ``lever()`` for each."""

    quick: bool = False
    device: str = field(default_factory=training_device)
    baseline: Run | None = None
    current: Run | None = None
    steps: list[Step] = field(default_factory=list)

    @property
    def settings(self) -> tuple[str, ...]:
        """What every run is given besides its levers: quick mode's sizes, and the device where the script's
        own choice can't be used."""
        device = () if self.device == script_default_device() else ("--device", self.device)
        return (QUICK_SETTINGS if self.quick else ()) + device

    def run(self, config: dict, trace: str | None = None) -> Run:
        return run_script(config, self.settings, trace)

    def start(self) -> Run:
        """The script at its defaults: the baseline every lever is measured against."""
        self.baseline = self.current = self.run({})
        return self.baseline

    def workers_for(self, change: dict) -> dict:
        """``change`` with workers added when it tunes them and none run yet: the fastest count tried, else one."""
        if any(name in change for name in NEEDS_WORKERS) and self.current.config.get("num_workers", 0) == 0:
            counts = [r for s in self.steps if s.lever == "workers" for r in s.tried]
            fastest = min(counts, key=lambda r: r.total).config["num_workers"] if counts else 1
            return {"num_workers": fastest, **change}
        return change

    def lever(self, name: str, changes: list[dict], note: str = "") -> Step:
        """Run the current configuration again, then each of ``changes`` (levers to set) on top of it; keep the
        fastest if it saves enough against that new run.

        A try that changes nothing (the platform's default named, say) is measured but never kept: its gain is noise.
        """
        # The current configuration runs again first: each try is compared with a run beside it in time, and not
        # with the run kept earlier, which was the fastest of its lever's tries (luck included). Quick mode (CI,
        # whose numbers nobody reads) saves that run.
        now = self.current if self.quick else self.run(self.current.config)
        tried = [self.run({**now.config, **self.workers_for(change)}) for change in changes]
        step = Step(name, now, tried, None, note)
        if changed(now.config, step.best.config) and step.saving(step.best) >= KEEP_GAIN:
            step.kept = self.current = step.best
        self.steps.append(step)
        return step

    def table(self) -> list[dict]:
        """A row for the baseline, then one per lever (its fastest try, kept or not), speed-ups over the baseline."""
        rows = [{"lever": "baseline", "change": "(the script's defaults)", "kept": True, "run": self.baseline}]
        for s in self.steps:
            rows.append({"lever": s.lever, "change": label(s.before.config, s.best.config),
                         "kept": s.kept is not None, "run": s.best})
        for row in rows:
            row.update(first=row["run"].epochs[0], epoch=row["run"].per_epoch, waiting=row["run"].waiting_share,
                       speedup=self.baseline.per_epoch / row["run"].per_epoch)
        return rows

    def traced(self) -> tuple[Any, Any]:
        """The baseline's and the final configuration's runs again, traced by minidl: two ``minidl.trace.Trace``."""
        import torch

        traces = []
        with tempfile.TemporaryDirectory() as folder:
            for i, config in enumerate((self.baseline.config, self.current.config)):
                path = os.path.join(folder, f"trace{i}.pt")
                self.run(config, trace=path)
                traces.append(torch.load(path, weights_only=False))  # a Trace we wrote ourselves, just now
        return traces[0], traces[1]


def print_table(rows: list[dict]) -> None:
    """The lever table, one row a line."""
    print(f"{'lever':<22}{'its fastest try':<48}{'kept':<6}{'first epoch':>12}{'an epoch':>10}{'waiting':>9}"
          f"{'speed-up':>10}")
    for r in rows:
        change = r["change"] if len(r["change"]) <= 46 else "..." + r["change"][-43:]
        print(f"{r['lever']:<22}{change:<48}{'yes' if r['kept'] else 'no':<6}{r['first']:>10.2f} s"
              f"{r['epoch']:>8.2f} s{r['waiting']:>9.0%}{r['speedup']:>9.2f}x")


def plot_table(rows: list[dict], ax: Any, caption: str) -> Any:
    """Each row's epoch as a bar split into waiting for data and the rest, zero-based; speed-up above each."""
    labels = [r["lever"] for r in rows]
    waiting = [r["epoch"] * r["waiting"] for r in rows]
    rest = [r["epoch"] - w for r, w in zip(rows, waiting)]
    x = range(len(rows))
    alpha = [1.0 if r["kept"] else 0.35 for r in rows]
    for i in x:
        ax.bar(i, waiting[i], color="tab:red", alpha=alpha[i], label="waiting for data" if i == 0 else None)
        ax.bar(i, rest[i], bottom=waiting[i], color="tab:blue", alpha=alpha[i],
               label="training step (and the rest)" if i == 0 else None)
        ax.text(i, rows[i]["epoch"], f"x{rows[i]['speedup']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels, rotation=30, ha="right")
    ax.set_ylim(0, max(r["epoch"] for r in rows) * 1.15)
    ax.set_ylabel("seconds an epoch (after the first)")
    ax.set_title(f"The script, one lever at a time (faded: tried, not kept)\n{caption}", fontsize=9)
    ax.legend(loc="upper right")
    return ax
