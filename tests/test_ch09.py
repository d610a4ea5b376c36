"""Tests for minidl_course.ch09: the photograph race of notebook 09 and the sentences it prints.

No speed is asserted: the race is checked for what it counts (rounds, batches, start methods, the same
batches from every kind of loader), and the verdicts are checked on made-up costs, one per branch.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from minidl_course import ch09, photos
from minidl_course.startup import ScriptStart, StartupCost


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = photos.photo_folder(1, cache=tmp_path_factory.mktemp("photos"))  # 9 files, one a photograph
    return ch09.PhotoEpoch(root, 12, size=32)


def test_an_epoch_cycles_over_the_files_and_ends_where_it_says(dataset):
    assert len(dataset) == 12 and len(dataset.photos) == 9
    image, label = dataset[10]
    assert image.dtype.name == "uint8" and image.shape == (3, 32, 32)
    assert label == dataset.photos.samples[1][1]  # sample 10 is file 1 again
    with pytest.raises(IndexError, match="12"):
        dataset[12]
    with pytest.raises(ValueError, match="n should be"):
        ch09.PhotoEpoch(dataset.photos.root, 0)


def test_a_loader_of_an_unknown_kind_is_refused_by_name(dataset):
    with pytest.raises(ValueError, match="kind"):
        ch09.make_loader("fibres", dataset, 2, 4)


@pytest.mark.timeout(240)
def test_every_kind_of_loader_gives_uint8_batches_of_every_sample(dataset):
    for kind in ch09.KINDS:
        batches = list(ch09.make_loader(kind, dataset, 2, 4))
        assert [len(t) for _, t in batches] == [4, 4, 4], kind
        assert all(images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32) for images, _ in batches)
        labels = torch.cat([t for _, t in batches]).tolist()
        assert labels == [dataset.photos.samples[i % 9][1] for i in range(12)], kind


@pytest.mark.timeout(300)
def test_the_race_times_each_kind_once_a_round_with_its_start_method(dataset):
    results = ch09.race(dataset, workers=2, batch_size=4, rounds=2)
    assert list(results) == list(ch09.KINDS)
    assert all(len(costs) == 2 and all(c.batches == 3 for c in costs) for costs in results.values())
    methods = {kind: {c.start_method for c in costs} for kind, costs in results.items()}
    assert methods == {"no workers": {"main process"}, "thread workers": {"thread"},
                       "process workers": {multiprocessing.get_start_method()}}
    lines = ch09.table(results).splitlines()
    assert [line.split()[0] for line in lines] == ["no", "thread", "process"]
    assert len(ch09.verdicts(results, 2)) >= 3


def costs(first_batch: dict[str, float], per_batch: dict[str, float], method: str = "spawn", batches: int = 8):
    methods = {"no workers": "main process", "thread workers": "thread", "process workers": method}
    return {k: [StartupCost(methods[k], first_batch[k], per_batch[k], batches, per_batch["no workers"])]
            for k in ch09.KINDS}


def test_threads_that_keep_pace_are_said_to_and_a_cheap_start_is_not_blamed():
    said = " ".join(ch09.verdicts(costs({"no workers": 0.1, "thread workers": 0.1, "process workers": 0.06},
                                        {"no workers": 0.1, "thread workers": 0.055, "process workers": 0.05}), 2))
    assert "keep pace" in said and "fall behind" not in said
    assert "stays near their steady pace" in said and "Start-up (spawn): the process workers' first batch" not in said


def test_threads_that_fall_behind_are_said_to_and_a_dear_start_is_blamed_by_its_method():
    said = " ".join(ch09.verdicts(costs({"no workers": 0.1, "thread workers": 0.1, "process workers": 2.0},
                                        {"no workers": 0.1, "thread workers": 0.1, "process workers": 0.05}), 2))
    assert "fall behind" in said
    assert "Start-up (spawn): the process workers' first batch came after 2.00 s" in said


def test_a_start_that_turns_a_faster_pace_into_a_slower_epoch_is_blamed_even_when_the_batches_took_longer():
    said = " ".join(ch09.verdicts(costs({"no workers": 0.11, "thread workers": 0.25, "process workers": 0.42},
                                        {"no workers": 0.113, "thread workers": 0.1, "process workers": 0.1}, "fork",
                                        batches=12), 2))
    assert "Start-up (fork): the process workers' first batch came after 0.42 s" in said
    assert "x0.89, not the x1.13 of their steady pace" in said


def test_when_no_worker_beats_none_the_run_says_it_cannot_tell_and_names_the_load_only_if_it_filled_the_cores():
    flat = costs({"no workers": 0.1, "thread workers": 0.2, "process workers": 0.4},
                 {"no workers": 0.1, "thread workers": 0.1, "process workers": 0.098})
    said = " ".join(ch09.verdicts(flat, 2, load=3.5, cores=2))
    assert "neither 2 thread nor 2 process workers beat no workers by a tenth" in said and "keep pace" not in said
    assert "load average (3.5 on 2 cores)" in said
    assert "load average" not in " ".join(ch09.verdicts(flat, 2, load=0.5, cores=2))
    assert "load average" not in " ".join(ch09.verdicts(flat, 2))


def test_the_split_of_a_sample_names_each_step_and_every_time_is_positive(dataset):
    split = ch09.sample_split(dataset, samples=3)
    assert list(split) == ["decode", "crop + resize", "flip", "to array"]
    assert all(s > 0 for s in split.values())


def test_a_super_linear_pace_is_called_noise_or_the_baselines_not_a_win():
    said = " ".join(ch09.verdicts(costs({"no workers": 0.03, "thread workers": 0.036, "process workers": 0.078},
                                        {"no workers": 0.0281, "thread workers": 0.0135, "process workers": 0.016}),
                                  2))
    assert "thread workers x2.08: above x2, more than 2 workers can multiply the work" in said
    assert "not a win of one kind of worker over the other" in said
    assert "process workers x1.76:" not in said  # within what 2 workers can give: nothing to explain
    within = " ".join(ch09.verdicts(costs({"no workers": 0.1, "thread workers": 0.1, "process workers": 0.06},
                                          {"no workers": 0.1, "thread workers": 0.055, "process workers": 0.05}), 2))
    assert "above x2" not in within


def test_the_sizes_shrink_for_the_courses_test_run(monkeypatch):
    monkeypatch.setenv("MINIDL_QUICK", "1")
    quick = ch09.sizes()
    monkeypatch.setenv("MINIDL_QUICK", "0")
    full = ch09.sizes()
    monkeypatch.delenv("MINIDL_QUICK")
    assert ch09.sizes() == full != quick
    assert quick.python_rounds < full.python_rounds and quick.photo_size < full.photo_size
    assert quick.start_epochs >= 2 and full.start_epochs >= 2  # "paid every epoch" needs a second epoch


def _run(top_runs: int) -> ScriptStart:
    """A forkserver run of 2 workers over 2 epochs whose script's top ran in ``top_runs`` other processes."""
    return ScriptStart("forkserver", 2, "3.13.0", {False: [1.0, 0.1]}, {False: [1.1, 0.2]}, 1.0, (0.9,) * top_runs)


def test_the_rerun_finding_says_who_ran_the_scripts_imports():
    assert "no other process" in ch09.rerun_finding(_run(0), 2)
    assert "the server, once" in ch09.rerun_finding(_run(1), 2)
    assert ch09.rerun_finding(_run(4), 2).startswith("every worker of every epoch ran the script's imports again (4")
    assert ch09.rerun_finding(_run(3), 2).startswith("3 other processes")
