"""The ``gpu`` suite: what pinned memory and PrefetchLoader's side stream buy on a CUDA machine.

Tasks (the CSV's ``task`` column, with what its ``size`` counts):

* ``h2d-copy`` (images per batch, each 3x224x224 uint8): one host-to-device copy from pageable and
  from pinned memory, timed on the GPU with CUDA events; the note gives the bandwidth in GB/s.
* ``h2d-wait`` (images per batch): what the CPU waits for. The wall time the training loop's thread
  spends inside ``x.to("cuda")`` called right after a step was queued, four ways: from pageable or pinned
  memory, blocking or ``non_blocking=True``. torch's blocking copy is ``cudaMemcpyAsync`` followed by
  ``cudaStreamSynchronize`` (``memcpy_and_sync`` in ``c10/cuda/CUDAFunctions.h``), so it waits for the
  queued step as well as the copy; CUDA documents that an asynchronous copy from pageable memory may be
  synchronous too. The row ``step alone`` is how long the queued step keeps the GPU busy.
* ``train-step`` (steps per epoch): an epoch of a stand-in training step, a few matmuls sized to take
  about as long as one batch's copy, fed five ways: batches already on the GPU (no copy at all), copy
  then step on one stream (from pinned memory, ``non_blocking``; and a beginner's blocking copy from
  pageable memory), and PrefetchLoader over pinned and over pageable batches. Timed on the GPU with CUDA
  events; the note says what fraction of the copy time the prefetcher hid, and how long the loop's thread
  took to queue the epoch by the host's clock (queuing, plus every wait inside a blocking call).
* ``pin-thread`` (images per batch): minidl's pin-memory thread beside torch's. The same batches, from
  two process workers, pinned by each loader's pin thread for the same device and copied to it; wall
  time per batch after the first (the thread's steady state, worker start left out), the two loaders
  taking turns round by round. The note on minidl's row gives the paired ratio minidl / torch; every
  round's figure goes to ``gpu_rounds.csv`` (round 0 the warm-up), so the ratio can be paired again.

The first three tasks' batches come from a list of ready-made host tensors, not a DataLoader, so the
host's loading time stays out of their numbers. Without CUDA the suite says it needs CUDA and records
nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from minidl_bench.harness import Session, Timing, missing

REQUIRES = ("torch",)
IMAGE_SHAPE = (3, 224, 224)  # an ImageNet-sized uint8 image
COPY_BATCHES = (1, 4, 16, 64, 256)
QUICK_COPY_BATCHES = (4, 32)
STEP_BATCH, STEPS = 128, 16  # train-step: images per batch, batches per epoch
QUICK_STEP_BATCH, QUICK_STEPS = 16, 6
MATMULS = 4  # per training step
PIN_BATCH, PIN_BATCHES, PIN_ROUNDS = 64, 24, 11  # pin-thread: images per batch, batches per epoch, timed rounds
QUICK_PIN_BATCH, QUICK_PIN_BATCHES = 8, 6  # quick: session.repeats rounds
PIN_WORKERS = 2
WAIT_BATCH, QUICK_WAIT_BATCH = 64, 8  # h2d-wait: images per copy
WAIT_STEP_S = 0.02  # h2d-wait: the step queued before each copy keeps the GPU busy about this long
WAIT_WAYS = {"pageable, blocking": ("pageable", False), "pageable, non_blocking": ("pageable", True),
             "pinned, blocking": ("pinned", False), "pinned, non_blocking": ("pinned", True)}


def cuda_time(fn: Callable[[], object], repeats: int) -> Timing:
    """Like ``harness.time_it``, but the GPU's time for the work ``fn`` queues, read from CUDA events."""
    import torch

    def once() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()  # start from an idle GPU, so nothing earlier is counted
        start.record()
        fn()
        end.record()
        end.synchronize()  # the events are only readable once the GPU has passed them
        return start.elapsed_time(end) / 1e3  # ms -> s

    first = once()  # the warm-up: CUDA context, allocator and kernel caches
    times = [once() for _ in range(repeats)]
    return Timing(statistics.median(times), min(times), max(times), repeats, first)


def host_time(fn: Callable[[], object], repeats: int, synchronize: Callable[[], object]) -> Timing:
    """The wall time the calling thread spends in ``fn()``, from an idle device: queuing its work, plus every wait
    inside a call that blocks (the host's clock; ``synchronize`` after each call, outside the timing)."""

    def once() -> float:
        synchronize()
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        synchronize()
        return took

    first = once()
    times = [once() for _ in range(repeats)]
    return Timing(statistics.median(times), min(times), max(times), repeats, first)


def run(session: Session) -> None:
    """Measure ``h2d-copy``, ``h2d-wait``, ``train-step`` and ``pin-thread``; save ``gpu_bandwidth.png`` and
    ``gpu_prefetch.png``."""
    import torch

    if not torch.cuda.is_available():
        session.skip("the whole suite", "it needs CUDA, and torch.cuda.is_available() is False here")
        return
    session.log(f"[{session.suite}] device: {torch.cuda.get_device_name()}")
    sizes, bandwidth = _h2d_copy(session, torch)
    weights = _sized_matmuls(torch, WAIT_STEP_S, session.repeats)
    host_wait(session, torch, "cuda", lambda: _chain(weights), torch.cuda.synchronize)
    steps = _train_step(session, torch)
    pin_thread(session, torch, "cuda", torch.cuda.synchronize)
    if missing("matplotlib"):
        session.skip("plots", "matplotlib not installed")
        return
    from minidl_bench import plot

    # Bandwidth is a size: line_plot starts its y-axis at zero (the x-axis spans decades: log).
    fig = plot.line_plot(sizes, bandwidth, logx=True, title=f"Host-to-device copy, {torch.cuda.get_device_name()}",
                         xlabel="batch size (3x224x224 uint8 images, log scale)", ylabel="bandwidth (GB/s)")
    session.savefig(fig, "gpu_bandwidth.png")
    # Bars from zero (log=False): the four epochs are within a few times of each other, and compare as lengths.
    fig = plot.bar_times(steps, title=f"An epoch of a stand-in training step, fed four ways, "
                         f"{torch.cuda.get_device_name()}", what="time per epoch", baseline="copy then step", log=False)
    session.savefig(fig, "gpu_prefetch.png")


def _h2d_copy(session: Session, torch) -> tuple[list[int], dict[str, list[float]]]:
    sizes = list(QUICK_COPY_BATCHES if session.quick else COPY_BATCHES)
    bandwidth: dict[str, list[float]] = {"pageable": [], "pinned": []}
    for n in sizes:
        pageable = torch.randint(0, 256, (n, *IMAGE_SHAPE), dtype=torch.uint8)
        sources = {"pageable": pageable, "pinned": pageable.pin_memory()}
        target = torch.empty_like(pageable, device="cuda")  # allocated once: only the copy is timed
        for method, source in sources.items():
            target.zero_()
            target.copy_(source, non_blocking=True)
            if not torch.equal(target.cpu(), pageable):
                raise AssertionError(f"[{session.suite}] {method} copy of {n} images is wrong")
            timing = cuda_time(lambda s=source, t=target: t.copy_(s, non_blocking=True), session.repeats)
            gbps = pageable.nbytes / timing.median / 1e9
            bandwidth[method].append(gbps)
            session.record("h2d-copy", method, timing, size=n, baseline=method == "pageable",
                           note=f"{pageable.nbytes / 1e6:.1f} MB, {gbps:.1f} GB/s")
    return sizes, bandwidth


def host_wait(session: Session, torch, device: str, queue_step: Callable[[], object],
              synchronize: Callable[[], object],
              to: Callable[..., object] | None = None) -> dict[str, list[float]]:
    """``h2d-wait``: seconds the calling thread spends in ``to(x, non_blocking)`` (default: ``x.to(device,
    non_blocking=...)``) called right after ``queue_step()`` queued a step on ``device``, for each of ``WAIT_WAYS``;
    ``step alone``: how long that step keeps the device busy (``synchronize`` waits for all queued work).

    Each round starts from an idle device, and the four ways take turns in rotating order. Returns every round's
    seconds per way, the warm-up round first. Raises AssertionError if a copy's bytes differ from the batch's.
    """
    from minidl_bench.loaders import timing

    n = QUICK_WAIT_BATCH if session.quick else WAIT_BATCH
    rounds = session.repeats if session.quick else max(session.repeats, PIN_ROUNDS)
    if to is None:
        def to(x, non_blocking):
            return x.to(device, non_blocking=non_blocking)
    g = torch.Generator().manual_seed(0)
    pageable = torch.randint(0, 256, (n, *IMAGE_SHAPE), dtype=torch.uint8, generator=g)
    sources = {"pageable": pageable, "pinned": pageable.pin_memory()}
    names = list(WAIT_WAYS)
    waits: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 1):  # round 0: the warm-up
        for name in names[r % len(names):] + names[:r % len(names)]:
            memory, non_blocking = WAIT_WAYS[name]
            synchronize()  # an idle device: only the step queued next is ahead of the copy
            queue_step()
            start = time.perf_counter()
            copy = to(sources[memory], non_blocking)
            waits[name].append(time.perf_counter() - start)
            synchronize()
            if r == 0 and not torch.equal(copy.cpu(), pageable):
                raise AssertionError(f"[{session.suite}] h2d-wait: the {name} copy of {n} images is wrong")
    # queued, then waited for: how long the step keeps the device busy
    step = host_time(lambda: (queue_step(), synchronize()), rounds, synchronize)
    note = f"{n} images, {pageable.nbytes / 1e6:.1f} MB; the step queued before each copy: {step.median * 1e3:.2f} ms"
    for name, values in waits.items():
        session.record("h2d-wait", name, timing(values), size=n, baseline=name == "pageable, blocking", note=note)
    session.record("h2d-wait", "step alone", step, size=n, note="the queued step, waited for: its time on the device")
    held = ", ".join(f"{name} {statistics.median(values[1:]) * 1e3:.3f} ms" for name, values in waits.items())
    session.log(f"[{session.suite}] h2d-wait: after a step of {step.median * 1e3:.2f} ms was queued, x.to() held the "
                f"loop's thread for (median of {rounds}): {held}")
    return waits


def _train_step(session: Session, torch) -> dict[str, Timing]:
    from minidl.prefetch import PrefetchLoader

    n, steps = (QUICK_STEP_BATCH, QUICK_STEPS) if session.quick else (STEP_BATCH, STEPS)
    g = torch.Generator().manual_seed(0)
    pageable = [(torch.randint(0, 256, (n, *IMAGE_SHAPE), dtype=torch.uint8, generator=g), torch.arange(n))
                for _ in range(steps)]
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in pageable]
    on_gpu = [(x.cuda(), y.cuda()) for x, y in pinned]
    stats = PrefetchLoader([], device="cuda")  # its mean and std, so every path normalises alike

    def normalise(x):
        return x.float().sub_(stats.mean).div_(stats.std)

    copy_time = cuda_time(lambda: pinned[0][0].to("cuda", non_blocking=True), session.repeats).median
    weights = _sized_matmuls(torch, copy_time, session.repeats)

    def step(x):
        h = weights[0] * x.mean()  # the step reads its batch, so it has to wait for it
        for w in weights:
            h = h @ w
        return h

    def no_copy():
        for x, _ in on_gpu:
            step(normalise(x))

    def copy_then_step():
        for x, _ in pinned:
            step(normalise(x.to("cuda", non_blocking=True)))

    def blocking_copy_then_step():  # a beginner's loop: pageable batches, x.to("cuda")
        for x, _ in pageable:
            step(normalise(x.to("cuda")))

    def prefetched(batches):
        def epoch():
            for x, _ in PrefetchLoader(batches, device="cuda"):
                step(x)
        return epoch

    for (got, _), (x, _) in zip(PrefetchLoader(pinned, device="cuda"), on_gpu):
        if not torch.equal(got, normalise(x)):
            raise AssertionError(f"[{session.suite}] PrefetchLoader's batches differ from the plain copy's")
    timings, queued = {}, {}
    for method, fn in (("data already on GPU", no_copy), ("copy then step", copy_then_step),
                       ("copy then step, pageable, blocking", blocking_copy_then_step),
                       ("PrefetchLoader, pinned", prefetched(pinned)),
                       ("PrefetchLoader, pageable", prefetched(pageable))):
        timings[method] = cuda_time(fn, session.repeats)
        queued[method] = host_time(fn, session.repeats, torch.cuda.synchronize).median
    copy_cost = timings["copy then step"].median - timings["data already on GPU"].median
    for method, timing in timings.items():
        note = (f"{n} images/step, {MATMULS} matmuls of {weights.shape[-1]}^2; the loop's thread queued the epoch "
                f"in {queued[method] * 1e3:.2f} ms (waits included)")
        if method.startswith("PrefetchLoader") and copy_cost > 0:
            hidden = (timings["copy then step"].median - timing.median) / copy_cost
            note += f"; hides {hidden:.0%} of the copy time"
            session.log(f"[{session.suite}] {method} hides {hidden:.0%} of the {copy_cost * 1e3:.2f} ms an epoch "
                        "spends copying")
        session.record("train-step", method, timing, size=steps, baseline=method == "copy then step", note=note)
    return timings


def pin_thread(session: Session, torch, device: str, synchronize: Callable[[], object]) -> dict[str, list[float]]:
    """``pin-thread``: seconds per batch through torch's and minidl's loaders, ``pin_memory=True``, each batch copied
    to ``device`` (``synchronize`` waits for the copies). Returns ``{"torch": [...], "minidl": [...]}`` per round,
    the warm-up round first. Raises AssertionError unless the two loaders give the same batches, pinned alike
    (``batches.assert_same_batches`` names the first difference)."""
    import warnings
    from functools import partial

    import minidl
    from minidl_bench.batches import assert_same_batches
    from minidl_bench.loaders import paired_ratio, run_rounds, timing, write_rows

    n, batches = (QUICK_PIN_BATCH, QUICK_PIN_BATCHES) if session.quick else (PIN_BATCH, PIN_BATCHES)
    rounds = session.repeats if session.quick else max(session.repeats, PIN_ROUNDS)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n * batches, *IMAGE_SHAPE), dtype=torch.uint8, generator=g)
    labels = torch.arange(n * batches)
    libraries = {"torch": torch.utils.data, "minidl": minidl}

    def loader(lib):
        return lib.DataLoader(lib.TensorDataset(images, labels), batch_size=n, num_workers=PIN_WORKERS,
                              pin_memory=True)

    def per_batch(epoch) -> float:  # after the first batch: the workers are up and the pin thread is busy
        it = iter(epoch)
        next(it)[0].to(device, non_blocking=True)
        synchronize()
        start, count = time.perf_counter(), 0
        for x, _ in it:
            x.to(device, non_blocking=True)
            count += 1
        synchronize()
        return (time.perf_counter() - start) / count

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # 2 workers on a 1-core machine
        theirs, ours = (list(loader(lib)) for lib in libraries.values())
        differ = f"[{session.suite}] minidl's pinned batches differ from torch's"
        assert_same_batches(ours, theirs, differ)
        pinned = [b[0].is_pinned() for b in theirs]
        if len(theirs) != batches:  # the epoch the rounds time, as torch gives it
            raise AssertionError(f"[{session.suite}] torch gave {len(theirs)} batches, not {batches}")
        if [b[0].is_pinned() for b in ours] != pinned:
            raise AssertionError(f"{differ}: pinned {[b[0].is_pinned() for b in ours]} != {pinned}")
        del theirs, ours  # their pinned memory back to torch's cache before the timed rounds
        session.log(f"[{session.suite}] pin-thread: both loaders give the same {batches} batches, "
                    f"pinned: {all(pinned)}")
        session.plan(2 * (rounds + 1))
        results = run_rounds({name: partial(loader, lib) for name, lib in libraries.items()}, rounds, per_batch,
                             session.progress("pin-thread"))
    write_rows(session.out / "gpu_rounds.csv", [
        {"task": "pin-thread", "size": n, "method": name, "workers": PIN_WORKERS, "round": r, "per_batch_s": s}
        for name, values in results.items() for r, s in enumerate(values)])
    ratio = paired_ratio([m / t for m, t in zip(results["minidl"][1:], results["torch"][1:])])
    for name, values in results.items():
        note = f"{n} images/batch, {PIN_WORKERS} process workers, pinned: {all(pinned)}"
        if name == "minidl":
            note += f"; per batch, minidl / torch paired by round: {ratio}"
        session.record("pin-thread", name, timing(values), size=n, workers=PIN_WORKERS, baseline=name == "torch",
                       note=note)
    session.log(f"[{session.suite}] pin-thread: seconds per batch, minidl / torch, median [CI] of {rounds} paired "
                f"rounds: {ratio}")
    return results


def _chain(weights) -> None:
    """Queue ``MATMULS`` chained matrix products: a step's worth of GPU work that returns at once."""
    h = weights[0]
    for w in weights:
        h = h @ w


def _sized_matmuls(torch, seconds: float, repeats: int):
    """``MATMULS`` square weight matrices whose chained product takes about ``seconds`` on this GPU."""
    side = 1024
    for _ in range(2):  # time a guess, rescale by the cube law, check once more
        weights = torch.randn(MATMULS, side, side, device="cuda") / side**0.5
        took = cuda_time(lambda weights=weights: _chain(weights), repeats).median
        side = int(min(max(side * (seconds / took) ** (1 / 3), 128), 16384)) // 64 * 64
    return torch.randn(MATMULS, side, side, device="cuda") / side**0.5
