"""The same script as spawn_unguarded.py, with the guard: a spawned worker imports it and runs nothing.

``python -m minidl_course.spawn_guarded`` (notebook 12).
"""

from minidl import DataLoader
from minidl_course.pitfalls import TensorPairDataset


def main() -> None:
    loader = DataLoader(TensorPairDataset(8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    print("batches:", sum(1 for _ in loader))


if __name__ == "__main__":
    main()
