"""The datasets the ``loaders`` and ``overhead`` suites load: four kinds of per-sample work.

* ``PythonWorkload``: a pure-Python pixel loop, holding the GIL the whole time;
* ``NumpyWorkload``: crop, flip and normalise in-memory uint8 images with NumPy (releases the GIL in part);
* ``ImageFolderWorkload``: decode real photographs with Pillow (decoding releases the GIL) and augment them
  as timm's ``create_loader`` does, from the JPEG folder ``minidl_course.photos.photo_folder()`` cuts once
  from the pictures scikit-image and matplotlib ship, into a cache outside the repository;
* ``IoWorkload``: ``time.sleep`` per sample, as reading from network storage, plus a small payload.

Each is a plain class with ``__len__`` and ``__getitem__``, so ``torch.utils.data.DataLoader`` and
``minidl.DataLoader`` load the very same object, and lives at module top level so spawn/forkserver
workers can import it. Random augmentation is seeded by the sample's index alone: every loader, worker
and worker method returns identical batches, which is what lets the suites check them before timing.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np

from minidl_course import photos

MEAN = (0.485, 0.456, 0.406)  # ImageNet's channel statistics, as in torchvision's Normalize
STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 10

Sample = tuple[np.ndarray, int]  # (image-like array, label): default_collate batches both


def _own(*values: float) -> list[float]:
    """New float objects equal to ``values``, owned by the calling thread (see ``PythonWorkload``)."""
    return [v + 0.0 for v in values]  # v + 0.0 is computed at run time: a new object (float(v) returns v)


class PythonWorkload:
    """``n`` samples whose transform is a pure-Python loop over ``3 * side * side`` pixels (GIL held).

    The loop reads six float constants per pixel: ``MEAN[c]``, ``STD[c]``, ``255.0``, ``2.2`` and the clip
    bounds ``-2.0`` and ``2.0``. By default it reads copies that this call made; ``shared_constants=True``
    reads the module's and the code's own objects, as one would first write it. The samples are equal
    either way; the difference shows only on a free-threaded build with several thread workers. There an
    object belongs to the thread that made it: its owner updates the reference count with plain
    arithmetic, every other thread with an atomic operation on a count they all share. Constants made by
    the importing thread and passed to ``min``/``max`` 6,000 times a sample from two threads keep one
    cache line moving between the cores: ``perf`` on 3.13t put 9.0% of the samples in ``_Py_DecRefShared`` on
    an Intel Xeon and 2.9% on an AMD EPYC (0.04% and 0.01% with copies; ``results/threads/xeon/perf_decref.txt``,
    ``results/threads/perf_decref.txt``). Notebook 09 measures both side by side.
    """

    def __init__(self, n: int, side: int = 32, shared_constants: bool = False) -> None:
        self.n, self.side, self.shared_constants = n, side, shared_constants

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Sample:
        if self.shared_constants:
            mean, std, scale, gamma, lo, hi = MEAN, STD, 255.0, 2.2, -2.0, 2.0
        else:
            mean, std, (scale, gamma, lo, hi) = _own(*MEAN), _own(*STD), _own(255.0, 2.2, -2.0, 2.0)
        rng = random.Random(index)
        pixels = [rng.randrange(256) for _ in range(3 * self.side * self.side)]
        per_channel = self.side * self.side
        out = []
        for i, p in enumerate(pixels):  # gamma-correct, standardise and clip, one Python float at a time
            c = i // per_channel
            out.append(min(max(((p / scale) ** gamma - mean[c]) / std[c], lo), hi))
        return np.array(out, dtype=np.float32).reshape(3, self.side, self.side), index % NUM_CLASSES


class NumpyWorkload:
    """``n`` samples from in-memory uint8 images (3 x (size+pad)^2): a random crop, flip and normalise each.

    ``pool`` images are held (all ``n`` by default); sample ``i`` crops image ``i % pool``, so a long epoch
    needn't hold a long epoch's worth of pixels.
    """

    def __init__(self, n: int, pool: int | None = None, size: int = 64, pad: int = 8, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n, self.size, self.pad = n, size, pad
        pool = pool or n
        self.images = rng.integers(0, 256, size=(pool, 3, size + pad, size + pad), dtype=np.uint8)
        self.labels = rng.integers(0, NUM_CLASSES, size=pool)
        self._mean = np.array(MEAN, dtype=np.float32).reshape(3, 1, 1)
        self._std = np.array(STD, dtype=np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Sample:
        rng = np.random.default_rng(index)  # by index, not by worker: the same sample in every loader
        y, x = rng.integers(0, self.pad + 1, size=2)
        crop = self.images[index % len(self.images), :, y:y + self.size, x:x + self.size]
        if rng.random() < 0.5:
            crop = crop[:, :, ::-1]
        out = (crop.astype(np.float32) / np.float32(255.0) - self._mean) / self._std
        return out, int(self.labels[index % len(self.labels)])


class ImageFolderWorkload:
    """The photographs of ``root`` (a ``photo_folder()``): decode, random-resized-crop to ``size``, flip.

    timm's training transforms (``minidl_course.photos.train_transform``), drawing from a stream seeded by
    the sample's index rather than the worker's. ``limit`` keeps the first ``limit`` files, taken round-robin
    over the classes, so a short epoch still sees every class. Samples are CHW uint8 arrays.
    """

    def __init__(self, root: str | Path, limit: int | None = None, size: int = 224) -> None:
        self.photos = photos.Photos(root, limit=limit)
        self.transform = photos.train_transform(size)
        self.samples, self.classes, self.size = self.photos.samples, self.photos.classes, size

    def __len__(self) -> int:
        return len(self.photos)

    def __getitem__(self, index: int) -> Sample:
        image, label = self.photos.load(index)
        return self.transform(image, random.Random(index)), label


class IoWorkload:
    """``n`` samples that each wait ``latency`` seconds (storage over a network), then return ``payload`` bytes."""

    def __init__(self, n: int, latency: float = 0.004, payload: int = 4096) -> None:
        self.n, self.latency, self.payload = n, latency, payload

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Sample:
        time.sleep(self.latency)  # a blocking wait: the GIL is released, no core is busy
        data = np.random.default_rng(index).integers(0, 256, size=self.payload, dtype=np.uint8)
        return data, index % NUM_CLASSES
