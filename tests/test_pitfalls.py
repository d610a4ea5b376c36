"""The deliberate mistakes of minidl_course/pitfalls.py: they must go wrong exactly as notebooks 06 and 12 say."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from loadertools import alive_in_group

from minidl_course import pitfalls, toy

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_global_draws_names_this_process_and_follows_the_global_seeds():
    random.seed(3)
    np.random.seed(3)
    expected = {"random": [random.random(), random.random()], "numpy": np.random.rand(2).tolist()}
    random.seed(3)
    np.random.seed(3)
    pid, draws = pitfalls.global_draws(2)
    assert pid == os.getpid()
    assert {k: draws[k] for k in expected} == expected


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method")
def test_forked_processes_repeat_numpy_and_torch_draws_but_not_python_random():
    np.random.seed(0)
    # One task per process: each is a fresh fork of this process, as each DataLoader worker is.
    with multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
        results = pool.map(pitfalls.global_draws, [3] * 4, chunksize=1)
    pids = [pid for pid, _ in results]
    assert len(set(pids)) == 4 and os.getpid() not in pids
    draws = [d for _, d in results]
    np.random.seed(0)
    parent = np.random.rand(3).tolist()
    assert all(d["numpy"] == parent for d in draws)  # the parent's next draws, four times over
    if "torch" in draws[0]:
        assert all(d["torch"] == draws[0]["torch"] for d in draws)
    assert len({tuple(d["random"]) for d in draws}) == 4  # random reseeds itself after fork


# --- notebook 12: each reproduction behaves as the notebook says ---------------------------------------


def test_name_datasets_return_the_same_items():
    names = pitfalls.file_names(1000)
    as_list, as_array = pitfalls.NameListDataset(names), pitfalls.NameArrayDataset(names)
    assert len(as_list) == len(as_array) == 1000
    assert [as_list[i] for i in range(1000)] == [as_array[i] for i in range(1000)] == [len(n) for n in names]


@pytest.mark.measures
@pytest.mark.timeout(120)
def test_list_of_str_workers_copy_the_list_and_array_workers_do_not():
    names = pitfalls.file_names(200_000)
    list_bytes = sum(sys.getsizeof(n) for n in names)  # the str objects a worker would copy
    runs = {cls: pitfalls.worker_memory_over_epoch(cls(names), num_workers=2, batch_size=512)
            for cls in (pitfalls.NameListDataset, pitfalls.NameArrayDataset)}
    uss = {cls: [w[-1] - w[0] for w in r["uss"]] for cls, r in runs.items()}
    mb = list_bytes / pitfalls.MB
    # USS is the worker's own pages: what it copied, whatever else runs. PSS also shares out the pages other
    # processes map (torch's libraries, the parent's heap), so other processes move it by megabytes: it is
    # recorded at every mark for the notebook's plot, and the copying is asserted on USS alone.
    assert all(g > 0.5 * mb for g in uss[pitfalls.NameListDataset])  # most of the list became private
    assert all(g < 0.2 * mb for g in uss[pitfalls.NameArrayDataset])
    for r in runs.values():
        assert r["fraction"][-1] == 1.0
        assert all(len(w) == len(r["fraction"]) and min(w) > 0 for key in ("pss", "uss") for w in r[key])


@pytest.mark.timeout(120)
def test_file_descriptor_strategy_runs_out_of_files_and_file_system_does_not():
    fd = pitfalls.run_child(["open_files", "file_descriptor", "128"], timeout=100)
    fs = pitfalls.run_child(["open_files", "file_system", "128"], timeout=100)
    assert fd["returncode"] == 0 and fs["returncode"] == 0, fd["stderr"] + fs["stderr"]
    assert "Too many open files" in fd["result"]["torch"]["error"]
    assert "set_sharing_strategy('file_system')" in fd["result"]["torch"]["error"]
    assert fd["result"]["minidl"]["error"] is not None
    assert all(r["kept"] < 64 for r in fd["result"].values())  # two descriptors per kept batch, 128 allowed
    assert fs["result"] == {lib: {"kept": 300, "error": None} for lib in ("torch", "minidl")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("workers", "prefetch"), [(1, 1), (2, 2), (2, 3)])
def test_shared_memory_in_flight_is_workers_times_prefetch_plus_the_held_batch(workers, prefetch):
    r = pitfalls.shm_in_flight(num_workers=workers, prefetch_factor=prefetch, batch_size=8, shape=(3, 16, 16))
    assert r["batch_bytes"] == 8 * 3 * 16 * 16 * 4 + 8 * 8  # float32 images, int64 labels
    assert r["segments"] == 2 * (workers * prefetch + 1)
    assert r["shared_bytes"] == (workers * prefetch + 1) * r["batch_bytes"]


def test_the_recorded_linux_runs_say_what_the_live_ones_assert():
    """What a Mac is shown instead of a measurement holds what the live run asserts of USS, and notebook 12's
    summary of its PSS: the list workers' grows, the array workers' does not."""
    memory = pitfalls.COPY_ON_READ_RECORDED
    grow = {label: [w[-1] - w[0] for w in memory[label]["pss"]] for label in ("list of str", "NumPy array")}
    assert min(grow["list of str"]) > 5 * max(max(grow["NumPy array"]), 0.5)
    own = {label: [w[-1] - w[0] for w in memory[label]["uss"]] for label in ("list of str", "NumPy array")}
    assert min(own["list of str"]) > 5 * max(max(own["NumPy array"]), 0.5)
    assert all(len(w) == len(memory[label]["fraction"]) for label in grow for w in memory[label]["uss"])
    for (workers, prefetch), r in pitfalls.SHM_IN_FLIGHT_RECORDED.items():
        assert r["batch_bytes"] == 32 * 3 * 128 * 128 * 4 + 32 * 8 and r["segments"] == 2 * (workers * prefetch + 1)
        assert r["shared_bytes"] == (workers * prefetch + 1) * r["batch_bytes"]
    assert all(r["kept"] < 64 and r["error"].startswith("RuntimeError: Too many open files.")
               for r in pitfalls.OPEN_FILES_RECORDED.values())


def test_open_files_run_shows_the_recorded_run_where_torch_lacks_the_strategy(monkeypatch):
    from minidl_course import osfacts

    monkeypatch.setattr(osfacts, "sharing_strategy",
                        lambda name: osfacts.Fact(name, False, "torch offers only ['file_system'] on this platform"))
    monkeypatch.setattr(pitfalls, "run_child", lambda *a, **k: pytest.fail("ran a child"))
    run = pitfalls.open_files_run("file_descriptor")
    assert run == {"source": "recorded", "why": "torch offers only ['file_system'] on this platform",
                   "result": pitfalls.OPEN_FILES_RECORDED}


def test_without_proc_the_readers_say_so_instead_of_raising(monkeypatch):
    from minidl_course import osfacts

    monkeypatch.setattr(osfacts, "open_files", lambda: osfacts.Fact("fds", False, "no /proc"))
    assert pitfalls.shared_fds([os.getpid()]) is None
    with pytest.raises(OSError, match="can't show fds: no /proc"):
        pitfalls.shm_in_flight()


def test_torch_names_shared_memory_in_its_bus_error_message():
    texts = pitfalls.torch_bus_error_text()
    assert any("bus error" in t and "insufficient shared memory" in t for t in texts)


@pytest.mark.timeout(60)
def test_writing_a_page_with_nothing_behind_it_is_a_bus_error():
    run = pitfalls.run_child(["bus_error"], timeout=30)
    assert run["returncode"] == -signal.SIGBUS
    assert "Bus error" in run["stderr"] and run["result"] is None


NO_SPACE = "unable to allocate shared memory(shm) for file </torch_"


def _namespaces_work() -> bool:
    import subprocess

    prefix = pitfalls.namespace_prefix()
    return prefix is not None and subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0


needs_namespaces = pytest.mark.skipif(not _namespaces_work(), reason="no private mount/pid namespace here")


def _check_shm_full(r: dict) -> None:
    assert r["size_mib"] * 2**20 < 4 * r["batch_bytes"]  # four batches in flight cannot fit
    for library in ("torch", "minidl"):
        summary = pitfalls.error_summary(r[library]["error"])
        assert summary[0].startswith("RuntimeError: Caught RuntimeError in DataLoader worker process ")
        assert any(NO_SPACE in line and line.endswith("No space left on device (28)") for line in summary), summary
        assert r[library]["batches"] < r[library]["of"]
    assert "while collating sample[0]" in r["minidl"]["error"]  # minidl's collate names the field it was making
    assert r["shared_memory"]["returncode"] == -signal.SIGBUS  # sized, never reserved: killed at the write
    assert r["shared_memory"]["stderr"].startswith("Fatal Python error: Bus error")


@needs_namespaces
@pytest.mark.timeout(180)
def test_a_full_dev_shm_is_torchs_no_space_error_in_both_loaders_and_sigbus_without_reservation():
    run = pitfalls.shm_full(size_mib=4, timeout=150)
    assert (run["source"], run["why"]) == ("measured", "private mount and pid namespace")
    _check_shm_full(run["result"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefix", [None, ("false",), ("/nonexistent/unshare",)])
def test_without_a_namespace_the_recorded_run_comes_back_labelled(prefix):
    for function, recorded in ((pitfalls.shm_full, pitfalls.SHM_FULL_RECORDED),
                               (pitfalls.file_system_leftovers, pitfalls.LEFTOVERS_RECORDED)):
        run = function(prefix=lambda: prefix)
        assert run["source"] == "recorded" and run["result"] is recorded
        assert run["why"].startswith(pitfalls.NAMESPACE_UNAVAILABLE)
    _check_shm_full(pitfalls.SHM_FULL_RECORDED)  # the recorded text shows what a real run shows


@needs_namespaces
@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", [None, "spawn"])
def test_torch_shm_manager_removes_a_killed_processs_files_unless_it_is_killed_too(start_method, monkeypatch):
    # Under spawn the workers must be told to use file_system too (a worker_init_fn): the strategy is per
    # process. Without it they sent descriptors, no file was made, and the check below held for nothing.
    if start_method:
        start_method_dir = Path(__file__).parent / "start_method"
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(start_method_dir),
                                                                        os.environ.get("PYTHONPATH")])))
        monkeypatch.setenv("MINIDL_START_METHOD", start_method)
    run = pitfalls.file_system_leftovers(timeout=150)
    assert run["source"] == "measured"
    alone, both = run["result"]["process killed"], run["result"]["process and torch_shm_manager killed"]
    assert alone["files_held"] == both["files_held"] == 8  # 4 batches of 2 tensors, one file each
    assert alone["managers"] >= 1 and alone["files_left"] == 0
    assert both["managers"] >= 1 and both["files_left"] == both["files_held"]


def test_error_summary_keeps_the_first_line_and_the_last_exception():
    error = "RuntimeError: Caught X in worker 0.\nOriginal Traceback:\n  File a\nOSError: no room\nwhile collating"
    assert pitfalls.error_summary(error) == ["RuntimeError: Caught X in worker 0.", "  ...", "OSError: no room",
                                             "while collating"]
    assert pitfalls.error_summary("ValueError: bad") == ["ValueError: bad"]
    assert pitfalls.error_summary(None) == ["no error"]


@pytest.mark.timeout(200)
def test_spawn_without_the_main_guard_fails_and_with_it_works():
    unguarded = pitfalls.run_script("minidl_course.spawn_unguarded", timeout=90)
    assert unguarded.returncode != 0
    assert "RuntimeError" in unguarded.stderr and "bootstrapping phase" in unguarded.stderr
    assert "exited unexpectedly" in unguarded.stderr
    guarded = pitfalls.run_script("minidl_course.spawn_guarded", timeout=90)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.strip() == "batches: 2"


@pytest.mark.timeout(120)
def test_a_forked_child_blocks_on_a_lock_held_at_fork_time_and_a_spawned_one_does_not():
    fork = pitfalls.run_child(["fork_lock", "fork", "2"], timeout=60)
    spawn = pitfalls.run_child(["fork_lock", "spawn", "2"], timeout=60)
    assert fork["result"] == {"method": "fork", "hung": True, "exitcode": -signal.SIGKILL}
    assert spawn["result"] == {"method": "spawn", "hung": False, "exitcode": 0}


@pytest.mark.timeout(60)
def test_run_child_kills_the_whole_group_when_it_overstays():
    # fork_lock with a 30 s wait runs past a 3 s limit; its own forked child must go too.
    run = pitfalls.run_child(["fork_lock", "fork", "30"], timeout=3)
    assert run["timed_out"] and run["result"] is None
    assert alive_in_group(run["pid"]) == []  # dead (a zombie at most, until init reaps it)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_machine_cpu_seconds_counts_our_own_busy_time():
    busy0, total0 = pitfalls.machine_cpu_seconds()
    start = time.process_time()
    while time.process_time() - start < 0.5:  # half a CPU second of our own
        pass
    busy1, total1 = pitfalls.machine_cpu_seconds()
    assert busy1 - busy0 >= 0.4 and total1 - total0 >= busy1 - busy0 - 1e-6  # a fully busy machine: equal


def test_decode_like_samples_are_deterministic_and_waiting_ones_match_without_the_blur():
    a, b = pitfalls.DecodeLikeDataset(4, size=16), pitfalls.DecodeLikeDataset(4, size=16)
    img, label = a[3]
    assert img.shape == (16, 16, 3) and img.dtype == np.uint8 and label == 3
    assert np.array_equal(img, b[3][0])
    waiting = pitfalls.WaitingDataset(4, size=16, delay=0.0)
    assert np.array_equal(waiting[2][0], pitfalls.DecodeLikeDataset(4, size=16, rounds=0)[2][0])
    with pytest.raises(IndexError):
        a[4]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_train_throughput_feeds_every_batch_to_the_trainer(workers):
    from minidl_course.train import Trainer

    trainer = Trainer(channels=3, classes=10, seed=0)
    rate = pitfalls.train_throughput(pitfalls.DecodeLikeDataset(40, size=16, rounds=1), workers, batch_size=8,
                                     trainer=trainer)
    assert rate > 0 and trainer.steps == 5


@pytest.mark.timeout(60)
def test_train_epoch_counts_the_workers_cpu_time_in_cores_busy():
    from minidl_course.train import Trainer

    dataset = pitfalls.DecodeLikeDataset(48, size=32, rounds=40)
    trainer = Trainer(channels=3, classes=10, seed=0)
    pitfalls.train_epoch(pitfalls.DecodeLikeDataset(8, size=32, rounds=0), 0, batch_size=8, trainer=trainer)  # warm-up
    alone = pitfalls.train_epoch(dataset, 0, batch_size=8, trainer=trainer)
    loaded = pitfalls.train_epoch(dataset, 2, batch_size=8, trainer=trainer)
    start = time.process_time()
    for i in range(len(dataset)):
        dataset[i]
    decoding = time.process_time() - start
    assert alone["workers_cpu_s"] == 0 and loaded["workers_cpu_s"] > 0.8 * decoding  # the workers' decoding counted
    for r in (alone, loaded):
        assert r["cores_busy"] == pytest.approx((r["main_cpu_s"] + r["workers_cpu_s"]) / r["seconds"] / os.cpu_count())
        assert r["samples_per_s"] == pytest.approx(48 / r["seconds"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_are_started_every_epoch_unless_persistent(persistent):
    rows = pitfalls.epoch_times(persistent, epochs=3, method="fork")
    pids = [tuple(r["worker_pids"]) for r in rows]
    if persistent:
        assert len(set(pids)) == 1
    else:
        assert len({p for epoch in pids for p in epoch}) == 3 * 2  # new workers, new pids, each epoch
    assert all(0 < r["first_batch_s"] <= r["epoch_s"] for r in rows)


@pytest.mark.timeout(60)
def test_an_unsharded_iterable_is_repeated_per_worker_and_both_fixes_shard_it():
    from minidl import DataLoader

    def seen(dataset, **kwargs):
        return sorted(int(x) for batch in DataLoader(dataset, batch_size=4, num_workers=3, **kwargs) for x in batch)

    assert seen(toy.UnshardedRange(0, 10)) == sorted(list(range(10)) * 3)
    assert seen(toy.ShardedRange(0, 10)) == list(range(10))
    assert seen(toy.UnshardedRange(0, 10), worker_init_fn=pitfalls.shard_in_worker_init) == list(range(10))
