"""A training script WITHOUT the ``if __name__ == "__main__":`` guard, run with spawned workers.

Each spawned worker imports this file to find what it runs, so it runs the loader again, in the middle
of starting up: multiprocessing refuses. ``python -m minidl_course.spawn_unguarded`` (notebook 12).
"""

from minidl import DataLoader
from minidl_course.pitfalls import TensorPairDataset

# One worker: two would write their tracebacks to stderr at the same time, interleaved.
loader = DataLoader(TensorPairDataset(8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
print("batches:", sum(1 for _ in loader))
