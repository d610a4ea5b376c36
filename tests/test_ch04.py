"""Tests for minidl_course.ch04: the four ways of fetching a batch give the batches torch gives, and the traced
breakdown adds up to the time spent in ``next()``. No speed is asserted."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl
from minidl_course import ch04

N, BATCH = 50, 8
FEATURES = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
LABELS = torch.arange(N) % 4


def epoch(lib, mode, seed=0):
    torch.manual_seed(seed)  # the base seed a loader without its own generator draws from the global stream
    return [[t.clone() for t in batch] for batch in ch04.make_loader(lib, mode, FEATURES, LABELS, BATCH, seed)]


def same(a, b):
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


@pytest.mark.parametrize("mode", ch04.MODES)
def test_each_mode_gives_torchs_batches(mode):
    assert same(epoch(minidl, mode), epoch(tud, mode))


@pytest.mark.parametrize("mode", ["__getitems__ -> rows", "__getitems__ -> batch"])
def test_fetching_at_once_changes_how_a_batch_is_fetched_not_what_it_holds(mode):
    assert same(epoch(minidl, mode), epoch(minidl, "per sample"))
    assert same(epoch(tud, mode), epoch(tud, "per sample"))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, N - 1), max_size=20))
def test_a_made_batch_is_the_collated_rows(indices):
    made = ch04.MadeBatchTensorDataset(FEATURES, LABELS).__getitems__(indices)
    rows = minidl.default_collate([(FEATURES[i], LABELS[i]) for i in indices]) if indices else None
    assert all(len(t) == len(indices) for t in made)
    if indices:
        assert all(torch.equal(m, r) for m, r in zip(made, rows))


@pytest.mark.parametrize("mode", ch04.MODES)
def test_every_mode_sees_every_sample_once_in_batches_of_the_same_size(mode):
    batches = epoch(minidl, mode)
    assert [len(b[0]) for b in batches] == [BATCH] * (N // BATCH) + [N % BATCH]
    rows = torch.cat([b[0] for b in batches])
    assert sorted(rows[:, 0].tolist()) == FEATURES[:, 0].tolist()
    assert all(torch.equal(b[1], (b[0][:, 0] / 3).long() % 4) for b in batches)  # each label stays with its row


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, N - 1), max_size=20))
def test_getitems_is_the_list_of_getitem(indices):
    ds = ch04.BatchedTensorDataset(FEATURES, LABELS)
    got = ds.__getitems__(indices)
    assert len(got) == len(indices)
    assert all(torch.equal(g[0], ds[i][0]) and torch.equal(g[1], ds[i][1]) for g, i in zip(got, indices))


@pytest.mark.parametrize("mode", ch04.MODES)
def test_the_breakdown_adds_up_to_the_time_in_next(mode):
    loader = ch04.make_loader(minidl, mode, FEATURES, LABELS, BATCH, 0, trace=True)
    assert ch04._drain(loader) == 7
    parts = ch04.breakdown(loader.trace)
    assert set(parts) == set(ch04.PARTS)
    waits = [r["end"] - r["start"] for r in loader.trace.rows() if r["event"] == "wait" and r["batch"] is not None]
    assert sum(parts.values()) == pytest.approx(sum(waits) / len(waits))
    assert parts["fetching"] > 0
    assert (parts["collating"] > 0) == (mode != "BatchSampler as sampler")  # a pass-through collate still counts


def test_a_breakdown_of_nothing_and_an_unknown_mode_are_refused():
    loader = ch04.make_loader(minidl, "per sample", FEATURES, LABELS, BATCH, 0, trace=True)
    with pytest.raises(ValueError, match="trace"):
        ch04.breakdown(loader.trace)
    with pytest.raises(ValueError, match="mode"):
        ch04.make_loader(minidl, "all at once", FEATURES, LABELS, BATCH, 0)


def test_the_study_reports_every_mode_and_library():
    study = ch04.fetch_study(FEATURES, LABELS, batch_size=BATCH, repeats=1, traced_epochs=1)
    assert set(study.epochs) == {(m, lib) for m in ch04.MODES for lib in ("minidl", "torch")}
    assert all(len(seconds) == 1 and seconds[0] > 0 for seconds in study.epochs.values())
    assert study.batches == 7 and all(mode in study.table() for mode in ch04.MODES)
    assert all(f"{mode} x" in study.finding() for mode in ch04.MODES[1:])
    assert len(study.plot("t").axes[0].patches) == 3 * len(ch04.MODES)


def test_the_batch_size_study_times_every_mode_and_size_with_torch():
    best = ch04.batch_size_study(FEATURES, LABELS, sizes=(4, 16), repeats=1)
    assert set(best) == {(m, s) for m in (ch04.MODES[0], ch04.MODES[2]) for s in (4, 16)}
    assert all(seconds > 0 for seconds in best.values())
    table = ch04.batch_size_table(best, N)
    assert ch04.MODES[0] in table and ch04.MODES[2] in table and "16" in table
