"""Small labelled images for the training loops of notebooks 05 on: ``(uint8 H x W x C image, label)``.

``Trainer.step`` (``minidl_course.train``) consumes the batches. ``delay`` seconds of waiting per sample
stand in for a read from disk or network; ``slow`` samples wait ``slow_delay`` instead, like a large
file or a cold cache. The images are random but fixed by ``seed``, so every run loads the same data.
"""

from __future__ import annotations

import time

import numpy as np

from minidl.dataset import Dataset


class LabelledImages(Dataset):
    """``n`` random ``size x size x 3`` uint8 images with labels ``index % classes``.

    >>> image, label = LabelledImages(12)[11]
    >>> image.shape, image.dtype, label
    ((32, 32, 3), dtype('uint8'), 1)
    """

    def __init__(self, n: int, size: int = 32, classes: int = 10, delay: float = 0.0,
                 slow: tuple[int, ...] = (), slow_delay: float = 0.0, seed: int = 0) -> None:
        self.images = np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
        self.classes, self.delay, self.slow, self.slow_delay = classes, delay, tuple(slow), slow_delay

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        wait = self.slow_delay if index in self.slow else self.delay
        if wait:
            time.sleep(wait)
        return self.images[index], index % self.classes


def transform_collate(samples: list[tuple[np.ndarray, int]], transform) -> tuple:
    """Collate ``(image, label)`` samples into ``(images, labels)`` tensors, applying ``transform`` to each image.

    Run as a DataLoader's ``collate_fn``, the transform runs where collation runs: in the worker.
    Use ``functools.partial(transform_collate, transform=f)`` with a top-level ``f`` so workers can import it.

    >>> images, labels = transform_collate([LabelledImages(3)[i] for i in range(3)], transform=lambda x: x.T)
    >>> tuple(images.shape), labels.tolist()
    ((3, 3, 32, 32), [0, 1, 2])
    """
    import torch

    images = np.stack([transform(image) for image, _ in samples])
    labels = np.array([label for _, label in samples], dtype=np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)
