"""Checker for ch06_seeding: a ``worker_init_fn`` that reseeds each worker's copy of ``AugmentedDataset``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidl_course import toy
from minidl_course.exercises._common import _Checks, _loaders, _torch, first_hint
from minidl_course.exercises.ch06_sharding import SeenInfo, as_worker, in_loader, none_info


class AugmentedDataset(toy.RangeDataset):
    """Item ``i`` is ``(i, a random draw)`` from ``self.rng``, created once, here: a bug on purpose, as each worker
    gets a copy in the same state.

    >>> ds = AugmentedDataset(4)
    >>> [round(draw, 3) for _, draw in (ds[0], ds[1])]
    [0.676, 0.214]
    """

    def __init__(self, n: int, seed: int = 2024) -> None:
        super().__init__(n)
        self.rng = np.random.default_rng(seed)

    def __getitem__(self, index: int) -> tuple[int, float]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for AugmentedDataset({self.n})")
        return index, float(self.rng.random())


SEED_NUMPY = "toy.seed_numpy_from_worker reseeds NumPy's global stream, for a dataset that draws from it. "
DELEGATED = ("your worker_init_fn {0}, the loader's own per-worker generator: give the dataset a generator of its own, "
             "seeded from info.seed.")
RNG = DELEGATED.format("used info.rng") + " (None in a process worker, as in torch; minidl fills it for threads only)"
NO_RUN_REPEATS = ("seed from info.seed: a seed from worker_id alone repeats every epoch, and one from the process id "
                  "or the clock changes from run to run, so no run could be repeated.")


def _as_worker_of(worker_init_fn, worker_id, num_workers, seed, case, checks) -> tuple[list[float], SeenInfo, bool]:
    """``worker_init_fn`` run as a worker: its dataset's draws, the info it read, if NumPy's global stream moved."""
    dataset = AugmentedDataset(8)
    info = SeenInfo(worker_id, num_workers, seed, dataset)  # rng=None, as a process worker's; reading it is noted

    def explain(error: Exception) -> None:  # an error after reading info.rng: say why, not only what raised
        checks.first(case, ("rng" in info.read, f"your worker_init_fn read get_worker_info().rng, then raised "
                            f"{error!r}", RNG))
        none_info(checks, case)(error)

    with as_worker(info):
        seeded = np.random.get_state()
        checks.watched({"called toy.seed_numpy_from_worker": (toy.seed_numpy_from_worker,)}, case,
                       "your worker_init_fn {0}", SEED_NUMPY + DELEGATED.format("leans on it instead of reseeding "
                       "the dataset's own generator"), worker_init_fn, worker_id, what="worker_init_fn",
                       explain=explain)
        after = np.random.get_state()
    if "rng" in info.read:
        checks.fail(case, "your worker_init_fn read get_worker_info().rng", RNG)
    return [dataset[0][1] for _ in range(4)], info, not all(map(np.array_equal, seeded, after))


def _draws(loader_cls, worker_init_fn, persistent: bool, epochs: int) -> list[list[float]]:
    loader = loader_cls(AugmentedDataset(24), batch_size=4, num_workers=3, worker_init_fn=worker_init_fn,
                        collate_fn=list, persistent_workers=persistent, generator=_torch().Generator().manual_seed(7))
    return [[draw for batch in loader for _, draw in batch] for _ in range(epochs)]  # floats: no shared memory


def check_worker_seeding(worker_init_fn: Callable[[int], None]) -> None:
    """Check ch06_seeding: after ``worker_init_fn`` workers draw different numbers, new each epoch, reproducibly."""
    checks = _Checks(worker_init_fn)
    dataset = AugmentedDataset(8)
    untouched = [dataset[0][1] for _ in range(4)]  # what every worker draws without a fix
    for base_seed, num_workers in ((1234, 2), (98765, 3), (2**40 + 7, 2)):
        case, draws = f"AugmentedDataset(8) in {num_workers} workers whose base seed is {base_seed}", []
        for worker_id in range(num_workers):
            seed = base_seed + worker_id  # what the loader gives worker k, as torch does
            where = f"{case}, worker {worker_id} (info.seed={seed})"
            got, info, touched_global = _as_worker_of(worker_init_fn, worker_id, num_workers, seed, where, checks)
            if got == untouched:
                checks.fail(where, f"the dataset still draws {got[:2]}..., as it did before your worker_init_fn: "
                            "every worker would draw these same numbers", first_hint(
                                "set dataset.rng = np.random.default_rng(a seed made from info.seed).",
                                (touched_global, "you reseeded NumPy's global stream, but this dataset draws from "
                                 "dataset.rng: reseed get_worker_info().dataset.rng."),
                                ("dataset" not in info.read, "reseed the worker's own copy, get_worker_info().dataset, "
                                 "not a dataset from the notebook.")))
            again, other = (_as_worker_of(worker_init_fn, worker_id, num_workers, s, where, checks)[0]
                            for s in (seed, seed + 1000))  # the same seed again; another epoch's, or another run's
            checks.first(where, (again != got, f"called twice with the same info.seed, your worker_init_fn gave draws "
                                 f"{got[:2]}... and then {again[:2]}...", "seed from info.seed, not from the clock or "
                                 "the OS, so that a run can be repeated."),
                         (other == got, f"worker {worker_id} drew {got[:2]}... with info.seed={seed}, and the same "
                          f"with info.seed={seed + 1000}: your draws do not follow info.seed", NO_RUN_REPEATS))
            draws.append(got)
            checks.passed += 1
        checks.first(case, *((True, f"workers 0 and {k} draw the same numbers: {draws[0][:2]}...", "make the seed "
                              "depend on the worker, as info.seed does.") for k in range(1, num_workers)
                             if draws[k] == draws[0]))
    checks.refuse_cell_function(worker_init_fn, "import it from the module file the %%writefile cell writes.")
    # Each loader without persistent workers; torch's with them too, where info.seed stays the same every epoch
    for name, loader_cls, persistent in [(*loader, False) for loader in _loaders()] + [(*_loaders()[1], True)]:
        case = (f"{name}(AugmentedDataset(24), batch_size=4, num_workers=3, persistent_workers={persistent}, "
                "worker_init_fn=yours)")
        with in_loader(case, checks):  # two epochs; a second run's first
            (first, second), (again,) = (_draws(loader_cls, worker_init_fn, persistent, n) for n in (2, 1))
        repeated = next((x for x in first if first.count(x) > 1), 0.0)
        checks.first(case, (first.count(repeated) > 1, f"the draw {repeated:.6f} came {first.count(repeated)} times "
                            "in one epoch", "give each worker a generator of its own, seeded from info.seed."),
                     (set(first) & set(second), "the second epoch repeated draws of the first",
                      "seed the generator in worker_init_fn, from info.seed: without persistent workers it changes "
                      "every epoch; with them worker_init_fn runs once and the generator carries on."),
                     (first != again, "two runs with generator=torch.Generator().manual_seed(7) drew "
                      "different numbers", "seed from info.seed only, so that the loader's generator decides all."))
        checks.passed += 1
    checks.done()
