"""examples/train_photos.py, the capstone's training script, and minidl_course/capstone.py, the harness that tunes it.

The script trains and prints a line an epoch, under every start method, and leaves no process behind; each lever
flag sets the DataLoader argument of its name; the batched fetch gives the per-item fetch's batches. The harness
keeps a lever only when it saves enough, and its diffs change the lines a lever names. Last, notebook 13's
committed run: what its prose and printed sentences say agrees with its table.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tud = pytest.importorskip("torch.utils.data")
psutil = pytest.importorskip("psutil")

import minidl  # noqa: E402
from minidl_course import accelerators, capstone, startup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "13_your_training_script.ipynb"
SMALL = ["--limit", "18", "--size", "32", "--epochs", "2"]  # 2 of each class's photos, tiny crops
EPOCH = re.compile(r"^epoch (\d+): (\d+\.\d{3}) s, waiting for data (\d+\.\d)%, loss (\d+\.\d{3})$")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def script():
    """The script imported as the module ``train_photos`` (examples/ on sys.path, which workers inherit)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "examples"))
        yield importlib.import_module("train_photos")
        sys.modules.pop("train_photos", None)


# --- the script, run as a learner runs it ---------------------------------------------------------------------

def ours(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries ``marker``: the run's own, wherever they were re-parented."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("CAPSTONE_RUN") == marker:
                found.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def run_script(flags: list[str]) -> tuple[subprocess.CompletedProcess, list[psutil.Process]]:
    """The script run with ``flags``; what it printed, and its processes still alive a while after it exited."""
    marker = uuid.uuid4().hex
    done = subprocess.run([sys.executable, str(capstone.SCRIPT), *SMALL, "--device", "cpu", *flags],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=dict(os.environ, CAPSTONE_RUN=marker))
    deadline = time.monotonic() + 20  # a forkserver or resource tracker notices its parent is gone, then exits
    while (left := ours(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in left:  # reported below; not left behind for the next test
        p.kill()
    return done, left


@pytest.mark.parametrize("method", [None, *startup.start_methods()])
def test_the_script_trains_prints_an_epoch_a_line_and_leaves_nothing_running(method):
    workers = [] if method is None else ["--num-workers", "2", "--persistent-workers", "--start-method", method]
    done, left = run_script([*workers, "--batch-size", "8", "--torch-threads", "1"])
    assert done.returncode == 0, done.stderr
    header, *epochs = done.stdout.strip().splitlines()
    assert header == "18 photos, 3 batches an epoch, on cpu, torch.get_num_threads() = 1"
    matches = [EPOCH.match(line) for line in epochs]
    assert all(matches) and [int(m[1]) for m in matches] == [1, 2], done.stdout
    assert all(0 <= float(m[3]) <= 100 for m in matches)
    assert left == [], [p.cmdline() for p in left]


def test_a_bad_flag_is_refused_by_name_and_nothing_runs():
    done, left = run_script(["--start-method", "teleport"])
    assert done.returncode == 2 and "--start-method" in done.stderr and "invalid choice: 'teleport'" in done.stderr
    assert left == []


# --- each lever flag, the DataLoader argument of its name -----------------------------------------------------

def loader_for(script, flags: list[str]):
    return script.make_loader(script.parse([*SMALL, *flags]))


def test_the_defaults_are_torchs_dataloader_with_its_defaults(script):
    loader = loader_for(script, [])
    assert type(loader) is tud.DataLoader and type(loader.dataset) is script.Photos
    assert (loader.num_workers, loader.batch_size, loader.pin_memory) == (0, 32, False)
    assert loader.persistent_workers is False
    assert loader.prefetch_factor is None and loader.collate_fn is tud.default_collate
    assert isinstance(loader.sampler, tud.RandomSampler)
    assert script.parse([]).device == accelerators.accelerator()  # the accelerator where there is one, else cpu


@pytest.mark.parametrize(("flags", "expected"), [
    (["--num-workers", "3"], {"num_workers": 3, "prefetch_factor": 2, "persistent_workers": False}),
    (["--batch-size", "8"], {"batch_size": 8}),
    (["--num-workers", "1", "--persistent-workers"], {"persistent_workers": True}),
    (["--num-workers", "1", "--prefetch-factor", "4"], {"prefetch_factor": 4}),
    (["--pin-memory"], {"pin_memory": True}),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_each_lever_flag_sets_the_argument_of_its_name(script, flags, expected):
    loader = loader_for(script, flags)
    assert type(loader) is tud.DataLoader
    assert {name: getattr(loader, name) for name in expected} == expected


@pytest.mark.parametrize("method", startup.start_methods())
def test_start_method_sets_multiprocessing_context(script, method):
    loader = loader_for(script, ["--num-workers", "1", "--start-method", method])
    assert loader.multiprocessing_context.get_start_method() == method


def test_batched_fetch_sets_the_batch_making_dataset_and_a_pass_through_collate(script):
    loader = loader_for(script, ["--batched-fetch"])
    assert type(loader.dataset) is script.BatchedPhotos and loader.collate_fn is script.as_is
    batch = object()
    assert script.as_is(batch) is batch


def test_thread_workers_and_trace_swap_in_minidls_loader(script, tmp_path):
    threads = loader_for(script, ["--num-workers", "2", "--thread-workers"])
    assert type(threads) is minidl.DataLoader and threads.worker_method == "thread" and threads.trace is None
    traced = loader_for(script, ["--num-workers", "2", "--trace", str(tmp_path / "t.pt")])
    assert type(traced) is minidl.DataLoader and traced.worker_method == "multiprocessing"
    assert traced.trace is not None and traced.num_workers == 2


@pytest.mark.parametrize("config", [
    {}, {"num_workers": 2}, {"batch_size": 64, "batched_fetch": True},
    {"num_workers": 4, "persistent_workers": True, "prefetch_factor": 4, "multiprocessing_context": "spawn"},
    {"num_workers": 2, "worker_method": "thread", "torch_threads": 1, "pin_memory": True},
], ids=lambda c: " ".join(capstone.flags(c)) or "defaults")
def test_the_harness_flags_mean_to_the_script_what_the_harness_means(script, config):
    args = script.parse(capstone.flags(config))
    c = {**capstone.DEFAULTS, **config}
    assert (args.num_workers, args.batch_size, args.batched_fetch, args.persistent_workers, args.prefetch_factor,
            args.start_method, args.thread_workers, args.torch_threads, args.pin_memory) == (
        c["num_workers"], c["batch_size"], c["batched_fetch"], c["persistent_workers"], c["prefetch_factor"],
        c["multiprocessing_context"], c["worker_method"] == "thread", c["torch_threads"], c["pin_memory"])
    assert capstone.config_from_flags(capstone.flags(config)) == config


# --- the batched fetch gives what the per-item fetch gives ----------------------------------------------------

def batches(script, flags: list[str], seed: int = 0) -> list:
    torch.manual_seed(seed)  # the shuffle and each worker's seeds
    random.seed(seed)  # the augmentation in the main process
    return list(loader_for(script, ["--batch-size", "4", *flags]))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_batched_fetch_returns_the_per_item_fetchs_batches_for_the_same_seed(script, workers):
    per_item = batches(script, ["--num-workers", str(workers)])
    batched = batches(script, ["--num-workers", str(workers), "--batched-fetch"])
    assert len(per_item) == len(batched) == 5
    for (x, y), (bx, by) in zip(per_item, batched, strict=True):
        assert x.shape == bx.shape == (len(y), 3, 32, 32) and x.dtype == bx.dtype == torch.float32
        assert torch.equal(x, bx) and torch.equal(y, by)
    other_seed = batches(script, ["--num-workers", str(workers), "--batched-fetch"], seed=1)
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(per_item, other_seed))  # the seed decides the batches


# --- the harness -------------------------------------------------------------------------------------------

def test_a_diff_shows_only_the_lines_a_lever_changes():
    assert capstone.diff({}, {"num_workers": 2}) == [
        "- loader = DataLoader(photos, batch_size=32, shuffle=True)",
        "+ loader = DataLoader(photos, batch_size=32, shuffle=True, num_workers=2)"]
    assert capstone.diff({}, {"torch_threads": 1}) == ["+ torch.set_num_threads(1)"]
    batched = capstone.diff({}, {"batched_fetch": True})
    assert batched[0] == "- photos = Photos(folder, size)" and batched[2] == "+ photos = BatchedPhotos(folder, size)"
    assert len(batched) == 4 and batched[3].endswith("collate_fn=as_is)")
    pinned = capstone.diff({}, {"pin_memory": True})
    assert "+ images = images.to(device, non_blocking=True)" in pinned and len(pinned) == 4
    assert capstone.diff({"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"})[1].startswith(
        "+ loader = minidl.DataLoader(")


class Scripted(capstone.Tuning):
    """A Tuning whose runs take the times a table gives, by number of workers: no process started."""

    def __init__(self, seconds: dict):
        super().__init__(quick=False, device="cpu")
        self.seconds = seconds

    def run(self, config, trace=None):
        first, later = self.seconds[tuple(sorted(config.items()))]
        return capstone.Run(dict(config), "", [first, later, later], [0.5, 0.4, 0.4])


def test_a_lever_is_kept_only_when_it_saves_keep_gain_of_the_run():
    tuning = Scripted({(): (4.0, 3.0), (("num_workers", 1),): (3.0, 2.0), (("num_workers", 2),): (2.5, 1.5),
                       (("num_workers", 2), ("persistent_workers", True)): (2.5, 1.45)})
    tuning.start()
    workers = tuning.lever("workers", [{"num_workers": 1}, {"num_workers": 2}])
    assert workers.kept.config == {"num_workers": 2} and tuning.current is workers.kept
    assert workers.saving(workers.kept) == pytest.approx(1 - 5.5 / 10)
    persistent = tuning.lever("persistent", [{"persistent_workers": True}])  # 1.8% saved: under KEEP_GAIN
    assert persistent.kept is None and tuning.current is workers.kept
    assert "not kept" in str(persistent) and f"must save {capstone.KEEP_GAIN:.0%}" in str(persistent)
    rows = tuning.table()
    assert [r["kept"] for r in rows] == [True, True, False]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 2.0, 3.0 / 1.45])


def test_a_try_that_changes_nothing_is_never_kept_however_much_faster_it_ran():
    class Noisy(Scripted):  # the same configuration, measured a third time, runs 40% faster: a busy machine's noise
        def run(self, config, trace=None):
            self.calls = getattr(self, "calls", 0) + 1
            seconds = 1.8 if self.calls == 3 else 3.0
            return capstone.Run(dict(config), "", [seconds] * 3, [0.5] * 3)

    tuning = Noisy({})
    tuning.baseline = tuning.current = tuning.run({"num_workers": 2})
    step = tuning.lever("start method", [{"multiprocessing_context": None}])  # the default, unnamed
    assert step.saving(step.best) > capstone.KEEP_GAIN
    assert step.kept is None and tuning.current is tuning.baseline and "not kept" in str(step)


def test_a_lever_compares_its_tries_with_the_current_configuration_run_again_beside_them():
    class Lucky(Scripted):  # the workers' kept run was a lucky 1.0; every later run of it takes 1.5
        def run(self, config, trace=None):
            self.runs = getattr(self, "runs", []) + [dict(config)]
            lucky = config == {"num_workers": 2} and self.runs.count(config) == 1
            return super().run(config) if not lucky else capstone.Run(dict(config), "", [1.0] * 3, [0.4] * 3)

    tuning = Lucky({(): (3.0, 3.0), (("num_workers", 2),): (1.5, 1.5),
                    (("num_workers", 2), ("persistent_workers", True)): (1.4, 1.4)})
    tuning.start()
    assert tuning.lever("workers", [{"num_workers": 2}]).kept.total == 3.0
    step = tuning.lever("persistent", [{"persistent_workers": True}])
    assert tuning.runs[-2:] == [{"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}]
    assert step.before.total == 4.5 and step.kept is not None  # 1.4 against 1.5 run beside it, not the lucky 1.0
    quick = Lucky(tuning.seconds)
    quick.quick = True  # quick mode (CI) reads no number: it saves the extra run
    quick.start()
    quick.lever("workers", [{"num_workers": 2}])
    assert quick.lever("persistent", [{"persistent_workers": True}]).before is quick.steps[0].kept


def test_a_lever_that_needs_workers_gets_the_fastest_count_tried():
    tuning = Scripted({(): (2.0, 1.0), (("num_workers", 1),): (3.0, 2.0), (("num_workers", 2),): (2.5, 1.5),
                       (("num_workers", 2), ("persistent_workers", True)): (1.0, 0.5)})
    tuning.start()
    assert tuning.lever("workers", [{"num_workers": 1}, {"num_workers": 2}]).kept is None
    step = tuning.lever("persistent", [{"persistent_workers": True}])
    assert step.kept.config == {"num_workers": 2, "persistent_workers": True}


def test_the_harness_runs_the_script_and_traces_both_ends(tmp_path):
    tuning = capstone.Tuning(quick=True, device="cpu")
    tuning.baseline = capstone.run_script({}, tuple(SMALL) + ("--device", "cpu"))
    assert len(tuning.baseline.epochs) == 2 and all(t > 0 for t in tuning.baseline.epochs)
    assert all(0 <= w <= 1 for w in tuning.baseline.waiting)
    tuning.current = capstone.Run({"num_workers": 1}, "", [1.0], [0.0])
    first, last = tuning.traced()
    assert first.num_workers == 0 and last.num_workers == 1
    for trace in (first, last):
        events = {e["event"] for e in trace.events}
        assert {"wait", "consumer", "getitem"} <= events


# --- notebook 13's committed run: its prose and its printed sentences agree with its table ---------------------

def cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def output_of(needle: str) -> str:
    """The printed output of the code cell whose source contains ``needle``."""
    [cell] = [c for c in cells() if c["cell_type"] == "code" and needle in "".join(c["source"])]
    return "".join("".join(o.get("text", "")) for o in cell["outputs"] if o["output_type"] == "stream")


FIGURE = re.compile(r"\d+(\.\d+)?\s*(s|ms|%|seconds|times)\b|\bx\d|\d+(\.\d+)?x\b")


def test_the_chapters_prose_types_no_measured_figure():
    prose = [re.sub(r"`[^`]*`", "", "".join(c["source"])) for c in cells() if c["cell_type"] == "markdown"]
    assert [m.group() for text in prose for m in FIGURE.finditer(text)] == []


def table_rows() -> list[dict]:
    lines = output_of("tuning.table()").splitlines()
    row = re.compile(r"^(.{22})(.{48})(yes|no)\s+(\d+\.\d+) s\s+(\d+\.\d+) s\s+(\d+)%\s+(\d+\.\d+)x$")
    rows = [row.match(line) for line in lines[1:] if row.match(line)]
    return [{"lever": m[1].strip(), "kept": m[3] == "yes", "epoch": float(m[5]), "waiting": int(m[6]),
             "speedup": float(m[7])} for m in rows]


def test_the_table_speedups_are_the_baselines_epoch_over_each_rows():
    rows = table_rows()
    assert rows[0]["lever"] == "baseline" and len(rows) >= 8
    for r in rows:
        assert r["speedup"] == pytest.approx(rows[0]["epoch"] / r["epoch"], rel=0.02, abs=0.01)


def test_each_levers_verdict_is_the_tables_and_follows_keep_gain():
    rows = {r["lever"]: r for r in table_rows()[1:]}
    lever_cells = [c for c in cells() if c["cell_type"] == "code" and "tuning.lever(" in "".join(c["source"])]
    said = {}
    for c in lever_cells:
        text = "".join("".join(o.get("text", "")) for o in c["outputs"] if o["output_type"] == "stream")
        if ", on top of:" not in text:  # pin_memory where there is no CUDA: said so, nothing tried
            continue
        name = text.split(", on top of:")[0]
        verdict = re.search(r"^(kept: (\d+)% of the run's time saved|not kept: .* (saved|cost) (\d+)% of)", text, re.M)
        said[name] = verdict
        kept = verdict[1].startswith("kept")
        assert kept == rows[name]["kept"], name
        share = int(verdict[2] or verdict[4]) / 100 * (-1 if verdict[3] == "cost" else 1)
        assert (share >= capstone.KEEP_GAIN - 0.005) if kept else (share < capstone.KEEP_GAIN + 0.005), name
    assert set(said) == set(rows)


def test_the_summary_sentence_is_the_tables_first_and_last_kept_rows():
    text = output_of("tuning.table()")
    rows = table_rows()
    m = re.search(r"an epoch: (\d+\.\d+) s -> (\d+\.\d+) s \(x(\d+\.\d+)\); waiting for data: (\d+)% -> (\d+)%", text)
    last_kept = [r for r in rows if r["kept"]][-1]
    assert float(m[1]) == rows[0]["epoch"] and int(m[4]) == rows[0]["waiting"]
    assert float(m[2]) == last_kept["epoch"] and int(m[5]) == last_kept["waiting"]
    assert float(m[3]) == pytest.approx(last_kept["speedup"], abs=0.011)


def test_the_answer_printed_last_is_the_code_of_the_configuration_kept():
    final = re.search(r"^  to: python examples/train_photos.py ?(.*)$", output_of("tuning.table()"), re.M)[1]
    config = capstone.config_from_flags(final.split())
    answer = output_of("capstone.code(tuning.current.config)").split("\n\n")[0].splitlines()
    assert answer == capstone.code(config)
