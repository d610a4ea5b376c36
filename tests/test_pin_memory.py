"""pin_memory() and _pin_memory_loop against torch's, and the pin thread inside the DataLoader.

There is no accelerator on the CPU machines these run on, and torch's ``Tensor.pin_memory()`` raises
without one, so most tests pin fake objects whose ``pin_memory()`` returns a marked copy: torch's own
``pin_memory`` treats them exactly as minidl's must. The DataLoader tests pretend an accelerator exists
(``pretend_cuda``) to run the real pin thread end to end on such fake batches.
"""

from __future__ import annotations

import collections
import gc
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Mapping, MutableMapping

import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from accelerator_fakes import report_cuda, report_mps  # noqa: E402
from torch.utils.data._utils.pin_memory import _pin_memory_loop as torch_pin_memory_loop  # noqa: E402
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin_memory  # noqa: E402

import minidl  # noqa: E402
import minidl.dataloader  # noqa: E402
from minidl.pin_memory import _pin_memory_loop, pin_memory  # noqa: E402
from minidl.worker import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper  # noqa: E402
from minidl_bench.batches import assert_same_batch  # noqa: E402
from minidl_course import toy  # noqa: E402
from minidl_course.accelerators import pretend_cuda  # noqa: E402

PIN_THREAD = "minidl_pin_memory"


class Pinnable:
    """Stands in for a tensor: ``pin_memory()`` records the call and returns a pinned copy."""

    def __init__(self, value, pinned_in: str | None = None) -> None:
        self.value = value
        self.pinned_in = pinned_in  # the thread that pinned this copy; None: not pinned
        self.calls: list[str] = []

    def pin_memory(self) -> Pinnable:
        self.calls.append(threading.current_thread().name)
        return Pinnable(self.value, pinned_in=threading.current_thread().name)

    def __repr__(self) -> str:
        return f"Pinnable({self.value!r}, pinned_in={self.pinned_in!r})"

    def __eq__(self, other: object) -> bool:  # what assert_same_batch compares on a leaf: the value and who pinned it
        return type(other) is Pinnable and (self.value, self.pinned_in) == (other.value, other.pinned_in)

    __hash__ = None


class Unpinnable:
    """A batch whose ``pin_memory()`` fails, as a tensor would on a broken device."""

    def pin_memory(self):
        raise ValueError("this batch refuses to be pinned")


Point = collections.namedtuple("Point", ["x", "y"])


class TaggedDict(MutableMapping):
    """A mutable mapping with extra state: a shallow copy keeps ``tag``, so pinning must too."""

    def __init__(self, data=(), tag="t"):
        self._data, self.tag = dict(data), tag

    def __getitem__(self, k):
        return self._data[k]

    def __setitem__(self, k, v):
        self._data[k] = v

    def __delitem__(self, k):
        del self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __copy__(self):
        return TaggedDict(self._data, self.tag)


class FrozenDict(Mapping):
    """An immutable mapping rebuilt from a dict: its type survives pinning."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, k):
        return self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class StubbornMapping(FrozenDict):
    """An immutable mapping whose constructor takes no dict: pinning falls back to a plain dict."""

    def __init__(self, **items):
        super().__init__(items)


class TaggedList(list):
    pass


def tagged_list(items):
    out = TaggedList(items)
    out.tag = "kept"
    return out


# Each case builds fresh inputs, so minidl and torch each pin their own copy.
CASES = {
    "leaf": lambda: Pinnable(1),
    "str": lambda: "text",
    "bytes": lambda: b"raw",
    "int": lambda: 7,
    "none": lambda: None,
    "list": lambda: [Pinnable(1), Pinnable(2), "s"],
    "tuple": lambda: (Pinnable(1), 2.5, "s"),
    "namedtuple": lambda: Point(Pinnable(1), [Pinnable(2)]),
    "dict": lambda: {"a": Pinnable(1), "b": (Pinnable(2), "x")},
    "defaultdict": lambda: collections.defaultdict(list, a=Pinnable(1)),
    "custom MutableMapping": lambda: TaggedDict({"a": Pinnable(1)}, tag="keep me"),
    "immutable Mapping": lambda: FrozenDict({"a": Pinnable(1), "b": "s"}),
    "Mapping without a dict constructor": lambda: StubbornMapping(a=Pinnable(1)),
    "list subclass": lambda: tagged_list([Pinnable(1), Pinnable(2)]),
    "UserList": lambda: collections.UserList([Pinnable(1)]),
    "range": lambda: range(3),
    "nested": lambda: {"x": [Point(Pinnable(1), {"y": (Pinnable(2), b"z")})], "n": 3, "s": "t"},
}


def leaves(data):
    """Every Pinnable inside ``data``, in order."""
    if isinstance(data, Pinnable):
        return [data]
    if isinstance(data, str | bytes):
        return []
    if isinstance(data, Mapping):
        return [leaf for v in data.values() for leaf in leaves(v)]
    if isinstance(data, collections.abc.Iterable):
        return [leaf for v in data for leaf in leaves(v)]
    return []


@pytest.mark.parametrize("case", CASES)
def test_pin_memory_matches_torch(case):
    data = CASES[case]()
    ours, theirs = pin_memory(data), torch_pin_memory(CASES[case]())
    assert_same_batch(ours, theirs)
    me = threading.current_thread().name
    assert all(leaf.calls == [me] for leaf in leaves(data)), "every leaf pinned exactly once"
    assert all(leaf.pinned_in == me for leaf in leaves(ours))
    assert all(leaf.pinned_in is None for leaf in leaves(data)), "the input itself is left alone"


def test_pin_memory_keeps_a_deque_like_torch():
    ours, theirs = pin_memory(collections.deque([Pinnable(1)])), torch_pin_memory(collections.deque([Pinnable(1)]))
    assert type(theirs) is collections.deque
    assert_same_batch(ours, theirs)


def outcome(fn, data):
    """What ``fn(data)`` returns, or the exception it raises."""
    try:
        return fn(data)
    except Exception as e:
        return e


def test_pin_memory_on_real_tensors_does_what_torch_does():
    # Without an accelerator torch raises; with one it pins. Either way minidl must do the same.
    batch = {"x": torch.arange(6.0).view(2, 3), "y": [torch.tensor([1, 2])]}
    ours, theirs = outcome(pin_memory, batch), outcome(torch_pin_memory, batch)
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs) and str(ours) == str(theirs)
    else:
        assert ours["x"].is_pinned() and ours["y"][0].is_pinned()
        assert torch.equal(ours["x"], theirs["x"]) and torch.equal(ours["y"][0], theirs["y"][0])
    assert not batch["x"].is_pinned()


# --- _pin_memory_loop, driven directly -----------------------------------------------------------

@pytest.fixture
def loop_errors(monkeypatch):
    """Exceptions that escaped a thread (the loop must never let one escape)."""
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


def start_loop(in_queue, out_queue, done_event) -> threading.Thread:
    thread = threading.Thread(target=_pin_memory_loop, args=(in_queue, out_queue, None, done_event, None),
                              name=PIN_THREAD, daemon=True)
    thread.start()
    return thread


def stop_loop(thread, done_event, in_queue) -> None:
    done_event.set()
    in_queue.put((None, None))  # the wake-up dummy the DataLoader sends
    thread.join(timeout=2 * MP_STATUS_CHECK_INTERVAL + 1)
    assert not thread.is_alive()


def test_loop_pins_in_order_in_its_own_thread(loop_errors):
    in_q, out_q, done = queue.Queue(), queue.Queue(), threading.Event()
    thread = start_loop(in_q, out_q, done)
    sent = [(i, Pinnable(i)) for i in range(20)]
    for item in sent:
        in_q.put(item)
    got = [out_q.get(timeout=5) for _ in sent]
    stop_loop(thread, done, in_q)
    assert [idx for idx, _ in got] == list(range(20))
    assert [b.value for _, b in got] == list(range(20))
    assert all(b.pinned_in == PIN_THREAD for _, b in got)
    assert all(original.calls == [PIN_THREAD] for _, original in sent)
    assert out_q.empty() and not loop_errors  # the dummy was not forwarded


def test_loop_passes_a_workers_exception_through_untouched(loop_errors):
    in_q, out_q, done = queue.Queue(), queue.Queue(), threading.Event()
    thread = start_loop(in_q, out_q, done)
    try:
        raise KeyError("bad sample")
    except KeyError:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    in_q.put((3, wrapper))
    in_q.put((4, Pinnable(4)))
    idx, data = out_q.get(timeout=5)
    assert idx == 3 and data is wrapper
    assert out_q.get(timeout=5)[1].pinned_in == PIN_THREAD  # and the loop carries on
    stop_loop(thread, done, in_q)
    assert not loop_errors


def test_loop_turns_a_pinning_error_into_an_exception_wrapper(loop_errors):
    in_q, out_q, done = queue.Queue(), queue.Queue(), threading.Event()
    thread = start_loop(in_q, out_q, done)
    in_q.put((0, {"images": Unpinnable()}))
    in_q.put((1, Pinnable(1)))
    idx, data = out_q.get(timeout=5)
    assert idx == 0 and isinstance(data, ExceptionWrapper)
    with pytest.raises(ValueError, match="pin memory thread") as info:
        data.reraise()
    assert "this batch refuses to be pinned" in str(info.value)
    assert out_q.get(timeout=5)[1].pinned_in == PIN_THREAD
    stop_loop(thread, done, in_q)
    assert not loop_errors


class WaitLog(queue.Queue):
    """A queue that notes the timeout of every ``get``: how long a waiting loop can go without looking up."""

    def __init__(self):
        super().__init__()
        self.timeouts = []

    def get(self, block=True, timeout=None):
        self.timeouts.append(timeout)
        return super().get(block, timeout)


@pytest.mark.timeout(60)
def test_loop_stops_promptly_when_done_is_set_even_without_a_wake_up(loop_errors):
    # "Promptly" without a stopwatch: every wait is bounded by MP_STATUS_CHECK_INTERVAL, and once done is set
    # the loop ends after at most the wait it was in, with no message sent to wake it.
    in_q, out_q, done = WaitLog(), queue.Queue(), threading.Event()
    thread = start_loop(in_q, out_q, done)
    in_q.put((0, Pinnable(0)))
    out_q.get(timeout=5)
    while len(in_q.timeouts) < 2:  # the loop is back in a wait with nothing to get
        time.sleep(0.01)
    waits_before = len(in_q.timeouts)
    done.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert set(in_q.timeouts) == {MP_STATUS_CHECK_INTERVAL}
    assert len(in_q.timeouts) - waits_before <= 1
    assert not loop_errors


def test_loop_stops_while_blocked_on_a_full_out_queue(loop_errors):
    in_q, out_q, done = queue.Queue(), queue.Queue(maxsize=1), threading.Event()
    thread = start_loop(in_q, out_q, done)
    in_q.put((0, Pinnable(0)))
    in_q.put((1, Pinnable(1)))  # nobody reads: the loop waits to put this one
    deadline = time.monotonic() + 5
    while in_q.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_q.empty() and out_q.full()
    done.set()
    thread.join(timeout=2 * MP_STATUS_CHECK_INTERVAL + 1)
    assert not thread.is_alive()
    assert out_q.get_nowait()[0] == 0 and out_q.empty()  # the second batch was dropped, not forced in
    assert not loop_errors


LOOPS = {"torch": torch_pin_memory_loop, "minidl": _pin_memory_loop}


def first_line_of_pinning_error(loop, device_id: int) -> tuple[type, str]:
    """Run ``loop`` for device ``device_id`` on one batch that fails to pin; the error's type and first line."""
    in_q, out_q, done = queue.Queue(), queue.Queue(), threading.Event()
    thread = threading.Thread(target=loop, args=(in_q, out_q, device_id, done, None), daemon=True)
    thread.start()
    in_q.put((0, Unpinnable()))
    _, wrapper = out_q.get(timeout=5)
    stop_loop(thread, done, in_q)
    with pytest.raises(Exception) as info:
        wrapper.reraise()
    return type(info.value), str(info.value).splitlines()[0]


def test_a_pinning_error_names_the_device_in_torchs_words(loop_errors, monkeypatch):
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)  # no accelerator here
    theirs = first_line_of_pinning_error(torch_pin_memory_loop, 1)
    assert first_line_of_pinning_error(_pin_memory_loop, 1) == theirs
    assert theirs == (ValueError, "Caught ValueError in pin memory thread for device 1.")
    assert not loop_errors


class Traceable:
    """A batch that pins to a new object a weak reference can follow."""

    def __init__(self, pinned: list) -> None:
        self.pinned = pinned  # weak references to every pinned copy made

    def pin_memory(self) -> Traceable:
        copy = Traceable(self.pinned)
        self.pinned.append(weakref.ref(copy))
        return copy


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lib", LOOPS)
def test_the_loop_keeps_no_pinned_batch_alive_while_it_waits_for_the_next(lib, monkeypatch, loop_errors):
    # Pinned memory is scarce: once the consumer drops a batch, the waiting thread must not hold it either.
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    in_q, out_q, done = WaitLog(), queue.Queue(), threading.Event()
    thread = threading.Thread(target=LOOPS[lib], args=(in_q, out_q, 0, done, None), daemon=True)
    thread.start()
    pinned: list = []
    in_q.put((0, Traceable(pinned)))
    out_q.get(timeout=5)  # the consumer takes the pinned batch and drops it at once
    while len(in_q.timeouts) < 2:  # the loop is back waiting for the next batch
        time.sleep(0.01)
    assert len(pinned) == 1 and pinned[0]() is None
    stop_loop(thread, done, in_q)
    assert not loop_errors


# --- the DataLoader: no accelerator here, so a warning and plain batches --------------------------

LOADERS = {  # name -> (minidl kwargs, torch kwargs): torch has no thread workers, so processes stand in
    "num_workers=0": ({}, {}),
    "process workers": ({"num_workers": 2}, {"num_workers": 2}),
    "thread workers": ({"num_workers": 2, "worker_method": "thread"}, {"num_workers": 2}),
}


def pin_warnings(loader):
    """Iterate ``loader``; return its batches and the messages of the pin_memory warnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    return batches, [str(w.message) for w in caught if "pin_memory" in str(w.message)]


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("name", LOADERS)
def test_without_accelerator_warns_once_like_torch_and_yields_plain_batches(name, monkeypatch):
    monkeypatch.setattr(minidl.dataloader, "_accelerator_available", lambda: False)
    ours_kw, torch_kw = LOADERS[name]
    dataset = minidl.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    ours, our_warnings = pin_warnings(minidl.DataLoader(dataset, batch_size=3, pin_memory=True, **ours_kw))
    theirs, their_warnings = pin_warnings(tud.DataLoader(tud.TensorDataset(*dataset.tensors), batch_size=3,
                                                         pin_memory=True, **torch_kw))
    assert len(their_warnings) == 1 and our_warnings == their_warnings
    assert len(ours) == len(theirs) == 4
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert torch.equal(x, tx) and torch.equal(y, ty)
        assert not x.is_pinned() and not y.is_pinned()


# --- the DataLoader with a pretend accelerator: the pin thread end to end ------------------------

class PinnableBatch:
    """A collated batch that pins like a tensor would: into a copy, noting which thread did it."""

    def __init__(self, items, pinned_in=None) -> None:
        self.items, self.pinned_in = list(items), pinned_in

    def pin_memory(self) -> PinnableBatch:
        return PinnableBatch(self.items, pinned_in=threading.current_thread().name)


def pinnable_collate(samples):
    return PinnableBatch(samples)


class ThreadsBatch:
    """A collated batch that, as it is pinned, notes how many threads torch's copies may use where it is pinned."""

    def __init__(self, items, threads=None) -> None:
        self.items, self.threads = list(items), threads

    def pin_memory(self) -> ThreadsBatch:
        return ThreadsBatch(self.items, threads=torch.get_num_threads())


def threads_collate(samples):
    return ThreadsBatch(samples)


def unpinnable_collate(samples):
    return Unpinnable() if 4 in samples else PinnableBatch(samples)


def pin_thread_alive() -> bool:
    return any(t.name == PIN_THREAD for t in threading.enumerate())


def pin_thread_gone(timeout: float = 5.0, collect: bool = False) -> bool:
    """Whether the pin thread is gone within ``timeout`` s; ``collect`` runs the cycle collector first."""
    if collect:
        gc.collect()
    deadline = time.monotonic() + timeout
    while pin_thread_alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def accelerator():
    """minidl believes torch found CUDA (``pretend_cuda``): pin_memory=True pins (our fake batches need no device)."""
    with pretend_cuda():
        yield


WORKERS = {  # name -> (DataLoader kwargs, the thread that should do the pinning)
    "num_workers=0": ({}, "MainThread"),
    "process workers": ({"num_workers": 2}, PIN_THREAD),
    "thread workers": ({"num_workers": 2, "worker_method": "thread"}, PIN_THREAD),
}


@pytest.mark.usefixtures("accelerator", "no_leaks")
@pytest.mark.parametrize("name", WORKERS)
def test_pin_thread_pins_every_batch_in_order(name):
    kwargs, pinner = WORKERS[name]
    # Sample 0 is slow, so its batch arrives after later ones: the order must still be kept.
    loader = minidl.DataLoader(toy.SlowDataset(12, slow=(0,), slow_delay=0.3), batch_size=2,
                               collate_fn=pinnable_collate, pin_memory=True, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accelerator "exists": no pin_memory warning
        batches = list(loader)
    assert [b.items for b in batches] == [[2 * i, 2 * i + 1] for i in range(6)]
    assert all(b.pinned_in == pinner for b in batches)
    assert pin_thread_gone()


@pytest.mark.usefixtures("accelerator", "no_leaks")
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_pin_thread_passes_a_worker_exception_through(worker_method):
    loader = minidl.DataLoader(toy.FailingDataset(10, bad_index=5, exc_type=KeyError), batch_size=2,
                               num_workers=2, worker_method=worker_method, collate_fn=pinnable_collate,
                               pin_memory=True)
    got = []
    kind = "thread" if worker_method == "thread" else "process"
    with pytest.raises(KeyError, match=f"in DataLoader worker {kind} 0"):
        for batch in loader:
            got.append(batch.items)
    assert got == [[0, 1], [2, 3]]
    # The re-raised exception's traceback holds the iterator in a reference cycle (as in torch), so
    # the iterator, and with it the pin thread, goes when the cycle collector runs.
    assert pin_thread_gone(collect=True)


@pytest.mark.usefixtures("accelerator", "no_leaks")
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_a_pinning_error_reaches_the_consumer(worker_method):
    loader = minidl.DataLoader(toy.RangeDataset(10), batch_size=2, num_workers=2, worker_method=worker_method,
                               collate_fn=unpinnable_collate, pin_memory=True)
    got = []
    with pytest.raises(ValueError, match="in pin memory thread") as info:
        for batch in loader:
            got.append(batch.items)
    message = str(info.value)
    del info  # its traceback holds the iterator
    assert "this batch refuses to be pinned" in message
    assert got == [[0, 1], [2, 3]]
    assert pin_thread_gone(collect=True)  # see the test above


@pytest.mark.usefixtures("accelerator", "no_leaks")
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("how", ["break", "del"])
def test_pin_thread_is_gone_after_break_or_del(worker_method, how):
    loader = minidl.DataLoader(toy.RangeDataset(40), batch_size=2, num_workers=2, worker_method=worker_method,
                               collate_fn=pinnable_collate, pin_memory=True)
    if how == "break":
        for batch in loader:  # noqa: B007 -- the batch is checked after the loop
            assert pin_thread_alive()  # so "gone" below means something
            break
    else:
        it = iter(loader)
        batch = next(it)
        assert pin_thread_alive()
        del it
    assert batch.pinned_in == PIN_THREAD
    assert pin_thread_gone(5.0)


@pytest.mark.usefixtures("accelerator", "no_leaks")
def test_pin_thread_with_persistent_workers_over_two_epochs():
    loader = minidl.DataLoader(toy.RangeDataset(8), batch_size=3, num_workers=2, persistent_workers=True,
                               collate_fn=pinnable_collate, pin_memory=True)
    for _ in range(2):
        batches = list(loader)
        assert [b.items for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
        assert all(b.pinned_in == PIN_THREAD for b in batches)
    assert pin_thread_alive()  # persistent: the thread outlives the epoch
    del loader, batches
    assert pin_thread_gone(5.0, collect=True)


@pytest.mark.usefixtures("accelerator", "no_leaks")
def test_after_a_worker_error_the_pin_thread_goes_without_the_cycle_collector():
    loader = minidl.DataLoader(toy.FailingDataset(10, bad_index=5, exc_type=KeyError), batch_size=2,
                               num_workers=2, collate_fn=pinnable_collate, pin_memory=True)
    gc.disable()  # reference counting alone must free the iterator once the exception is dropped
    try:
        try:
            list(loader)
        except KeyError:
            pass
        gone = pin_thread_gone(3.0)
    finally:
        gc.enable()
    assert gone


@pytest.mark.usefixtures("accelerator", "no_leaks")
@pytest.mark.parametrize("name", WORKERS)
def test_a_traced_loader_records_one_pin_span_per_batch(name):
    kwargs, pinner = WORKERS[name]
    loader = minidl.DataLoader(toy.RangeDataset(12), batch_size=2, collate_fn=pinnable_collate, pin_memory=True,
                               trace=True, **kwargs)
    assert len(list(loader)) == 6
    pins = [e for e in loader.trace.events if e["event"] == "pin"]
    assert sorted(e["batch"] for e in pins) == list(range(6))
    assert {e["lane"] for e in pins} == ({"main"} if pinner == "MainThread" else {"pin"})
    assert all(e["end"] >= e["start"] for e in pins)


# --- Apple's MPS: torch 2.13 turns pinning off there, with its own warning --------------------------

@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("name", LOADERS)
def test_on_mps_warns_like_torch_and_does_not_pin(name, monkeypatch):
    report_mps(monkeypatch)  # both libraries now see MPS; anything that pinned would raise on this CPU build
    ours_kw, torch_kw = LOADERS[name]
    dataset = minidl.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    ours, our_warnings = pin_warnings(minidl.DataLoader(dataset, batch_size=3, pin_memory=True, **ours_kw))
    theirs, their_warnings = pin_warnings(tud.DataLoader(tud.TensorDataset(*dataset.tensors), batch_size=3,
                                                         pin_memory=True, **torch_kw))
    assert their_warnings == ["'pin_memory' argument is set as true but not supported on MPS now, "
                              "device pinned memory won't be used."]
    assert our_warnings == their_warnings
    assert len(ours) == len(theirs) == 4
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert torch.equal(x, tx) and torch.equal(y, ty)
        assert not x.is_pinned() and not y.is_pinned()
    assert not pin_thread_alive()


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("lib", [tud, minidl], ids=["torch", "minidl"])
def test_the_pin_thread_copies_on_one_core_for_the_device_current_at_iter_like_torch(lib, monkeypatch):
    """torch's pin thread sets two things for itself alone: one thread for its copies, and the accelerator that was
    current when the iterator started (here the second of two)."""
    report_cuda(monkeypatch)
    chosen = []
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "set_device_index", chosen.append)
    main_threads = torch.get_num_threads()
    torch.set_num_threads(3)  # so one thread in the pin thread is its own setting, not this machine's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # more workers than cores, where there is one
            batches = list(lib.DataLoader(toy.RangeDataset(6), batch_size=2, num_workers=2, pin_memory=True,
                                          collate_fn=threads_collate))
        assert torch.get_num_threads() == 3  # the main thread's setting is untouched
    finally:
        torch.set_num_threads(main_threads)
    assert [(b.items, b.threads) for b in batches] == [([0, 1], 1), ([2, 3], 1), ([4, 5], 1)]
    assert chosen == [1]


ACCELERATORS = {"none": lambda monkeypatch: None, "cuda": report_cuda, "mps": report_mps}


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("pin", [False, True])
def test_the_pin_device_is_the_current_accelerators_type_like_torch(accelerator, pin, monkeypatch):
    # torch 2.13 sets _pin_memory_device to the current accelerator's type when it pins, and None otherwise.
    ACCELERATORS[accelerator](monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator, or MPS: torch's warnings, checked above
        ours, theirs = (iter(lib.DataLoader(range(4), pin_memory=pin)) for lib in (minidl, tud))
    assert (ours._pin_memory_device, ours._pin_memory) == (theirs._pin_memory_device, theirs._pin_memory)
    assert ours._pin_memory_device == (accelerator if pin and accelerator != "none" else None)
