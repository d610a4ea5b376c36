"""The spawn/forkserver start: minidl accepts and refuses what torch does, names what it refuses, pickles once."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import minidl  # noqa: E402
from minidl_course import toy  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

METHODS = ["spawn", "forkserver"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HoldsShared(tud.Dataset):
    """Six items; each __getitem__ uses a multiprocessing object the dataset holds, in the worker."""

    def __init__(self, kind, shared):
        self.kind, self.shared = kind, shared

    def __len__(self):
        return 6

    def __getitem__(self, i):
        _USE[self.kind](self.shared, i)
        return i


def _add_one(value, i):
    with value.get_lock():
        value.value += 1


def _pass_lock(lock, i):
    with lock:
        pass


_USE = {
    "Value": _add_one,
    "Lock": _pass_lock,
    "Barrier": lambda barrier, i: barrier.wait(timeout=10),
    "RawArray": lambda array, i: array.__setitem__(i, i + 1),
    "Queue": lambda q, i: q.put(i),
    "Event": lambda event, i: event.set(),
    "Manager dict": lambda d, i: d.__setitem__(i, i * i),
}


def _make(kind, ctx, manager):
    return {
        "Value": lambda: ctx.Value("i", 0),
        "Lock": ctx.Lock,
        "Barrier": lambda: ctx.Barrier(1),
        "RawArray": lambda: ctx.RawArray("i", 6),
        "Queue": ctx.Queue,
        "Event": ctx.Event,
        "Manager dict": lambda: manager.dict(),
    }[kind]()


def _seen_by_parent(kind, shared):
    """What the workers did to the shared object, read back in this process."""
    if kind == "Value":
        return shared.value
    if kind == "RawArray":
        return list(shared)
    if kind == "Queue":
        return sorted(shared.get(timeout=10) for _ in range(6))
    if kind == "Event":
        return shared.is_set()
    if kind == "Manager dict":
        return dict(shared)
    return None


EXPECTED = {"Value": 6, "RawArray": [1, 2, 3, 4, 5, 6], "Queue": list(range(6)), "Event": True,
            "Manager dict": {i: i * i for i in range(6)}, "Lock": None, "Barrier": None}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", list(_USE))
def test_a_dataset_holding_a_multiprocessing_object_reaches_workers_as_in_torch(kind, method):
    # Pickled outside a start, these refuse ("should only be shared between processes through
    # inheritance"); inside the start they travel as handles, in torch and in minidl alike.
    ctx = multiprocessing.get_context(method)
    manager = ctx.Manager() if kind == "Manager dict" else None
    try:
        results = {}
        for name, make_loader in [("torch", tud.DataLoader), ("minidl", minidl.DataLoader)]:
            shared = _make(kind, ctx, manager)
            loader = make_loader(HoldsShared(kind, shared), batch_size=2, num_workers=2,
                                 multiprocessing_context=method, timeout=60)
            batches = [b.tolist() for b in loader]
            results[name] = batches, _seen_by_parent(kind, shared)
        assert results["minidl"] == results["torch"] == ([[0, 1], [2, 3], [4, 5]], EXPECTED[kind])
    finally:
        if manager is not None:
            manager.shutdown()


class HoldsSocket(tud.Dataset):
    def __init__(self):
        self.sock = socket.socket()

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i * 10 + (self.sock.fileno() >= 0)


@pytest.mark.parametrize("method", METHODS)
def test_a_socket_reaches_workers_as_in_torch(method):
    # multiprocessing's pickler sends a socket as a duplicated handle: plain pickle refuses it.
    with pytest.raises(TypeError):
        pickle.dumps(socket.socket())
    dataset = HoldsSocket()
    try:
        got = {name: [b.tolist() for b in make(dataset, batch_size=2, num_workers=1, multiprocessing_context=method)]
               for name, make in [("torch", tud.DataLoader), ("minidl", minidl.DataLoader)]}
    finally:
        dataset.sock.close()
    assert got["minidl"] == got["torch"] == [[1, 11], [21, 31]]


class HoldsThreadLock(tud.Dataset):
    def __init__(self):
        self.lock = threading.Lock()

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


def start_both(dataset, method, **kwargs):
    """iter() over torch's loader and minidl's: the exception each raised, and the warnings each gave."""
    raised, warned = [], []
    for lib in (tud, minidl):
        with _recorded() as caught, pytest.raises(Exception) as e:
            iter(lib.DataLoader(dataset, num_workers=1, multiprocessing_context=method, **kwargs))
        raised.append(e.value)
        warned.append([str(w.message) for w in caught])
    return raised, warned


@contextlib.contextmanager
def _recorded():
    """Every warning given inside the block, even one given before."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def assert_torchs_error_with_a_note(theirs, ours, *hint_words):
    assert type(ours) is type(theirs) and str(ours) == str(theirs)  # torch's error, word for word
    [note] = ours.__notes__
    for words in hint_words:
        assert words in note, note


@pytest.mark.parametrize("method", METHODS)
def test_an_object_that_cannot_be_pickled_is_named_with_the_right_hint(method):
    # Its class is importable: "move it into a module" would send the learner the wrong way.
    (theirs, ours), (their_warnings, our_warnings) = start_both(HoldsThreadLock(), method)
    assert isinstance(ours, TypeError) and "_thread.lock" in str(ours)
    assert_torchs_error_with_a_note(theirs, ours, "dataset ", "HoldsThreadLock", "can't be pickled at all",
                                    "worker_init_fn")
    assert "top level" not in ours.__notes__[0]
    assert our_warnings == their_warnings and len(our_warnings) == 1  # torch's warning, as torch gives it


@pytest.mark.parametrize("method", METHODS)
def test_a_lock_from_a_fork_context_raises_runtime_error_with_the_hint(method):
    # torch lets multiprocessing's RuntimeError through as it is; so does minidl, with the fix in a note.
    dataset = HoldsShared("Lock", multiprocessing.get_context("fork").Lock())
    (theirs, ours), _ = start_both(dataset, method)
    assert isinstance(ours, RuntimeError) and "fork context" in str(ours)
    assert_torchs_error_with_a_note(theirs, ours, "dataset ", "HoldsShared", f"'{method}'", "get_context")


@pytest.mark.parametrize("method", METHODS)
def test_a_lambda_is_named_and_told_to_move_to_a_module(method):
    (theirs, ours), _ = start_both(toy.RangeDataset(4), method, collate_fn=lambda b: b)
    assert isinstance(ours, pickle.PicklingError | AttributeError)
    assert_torchs_error_with_a_note(theirs, ours, "collate_fn", "top level of a .py file")


class CellDataset(minidl.Dataset):
    """Stands in for a dataset defined in a notebook cell (module __main__)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("method", METHODS)
def test_a_class_from_an_interactive_main_is_named_before_any_worker_starts(method, monkeypatch):
    # It pickles by name, but the worker can't import an interactive __main__: torch's worker dies.
    import __main__

    monkeypatch.setattr(CellDataset, "__module__", "__main__")
    monkeypatch.setattr(__main__, "CellDataset", CellDataset, raising=False)  # as a cell defines it
    monkeypatch.delattr(__main__, "__file__", raising=False)
    with pytest.raises(pickle.PicklingError, match="dataset.*CellDataset.*interactive session.*.py file"):
        iter(minidl.DataLoader(CellDataset(), num_workers=1, multiprocessing_context=method))


@pytest.mark.parametrize("method", METHODS)
def test_a_dataset_of_large_arrays_starts(method):
    images = np.arange(3 * 64 * 64 * 8, dtype=np.float32).reshape(8, 3, 64, 64)  # 384 KiB, one buffer
    loader = minidl.DataLoader(images, batch_size=4, num_workers=1, multiprocessing_context=method)
    assert [b.shape for b in loader] == [(4, 3, 64, 64)] * 2


class CountsPickles(tud.Dataset):
    """Counts, in the process that pickles it, how often it was pickled."""

    pickled = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def __getstate__(self):
        type(self).pickled += 1
        return self.__dict__


@pytest.mark.parametrize("method", METHODS)
def test_the_dataset_is_pickled_once_per_worker_start_as_in_torch(method):
    counts = {}
    for name, make in [("torch", tud.DataLoader), ("minidl", minidl.DataLoader)]:
        CountsPickles.pickled = 0
        loader = make(CountsPickles(), batch_size=2, num_workers=2, multiprocessing_context=method)
        for _ in range(2):  # two epochs, two workers started in each
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
        counts[name] = CountsPickles.pickled
    # Under pytest-xdist __main__ is execnet's `python -c`, an interactive one: minidl's look for __main__
    # references then pickles once more per loader (test_from_an_interactive_main_the_check_pickles_once_per_loader).
    interactive = getattr(sys.modules["__main__"], "__file__", None) is None
    assert counts == {"torch": 4, "minidl": 4 + interactive}


def _run_python(args, stdin=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=240)


def test_from_an_interactive_main_the_check_pickles_once_per_loader():
    # `python -c` has an interactive __main__: minidl looks for __main__ references once per loader,
    # so the first epoch pickles the dataset once more than the workers need, the second not at all.
    code = textwrap.dedent("""
        import minidl
        from test_picklable import CountsPickles
        loader = minidl.DataLoader(CountsPickles(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
        for epoch in range(2):
            before = CountsPickles.pickled
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
            print(CountsPickles.pickled - before)
    """)
    done = _run_python(["-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "2"]


@pytest.mark.parametrize("method", METHODS)
def test_a_script_read_from_stdin_is_refused_before_any_worker_starts(method):
    # The worker re-runs the main script from its path, and '<stdin>' is no file: torch's worker dies.
    script = textwrap.dedent(f"""
        import multiprocessing, minidl
        from minidl_course import toy
        before = multiprocessing.active_children()
        try:
            iter(minidl.DataLoader(toy.RangeDataset(4), num_workers=1, multiprocessing_context="{method}"))
        except RuntimeError as e:
            print("refused:", e)
        print("children:", len(multiprocessing.active_children()) - len(before))
    """)
    done = _run_python(["-"], stdin=script)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "'<stdin>'" in done.stdout and "save the script" in done.stdout
    assert "children: 0" in done.stdout
