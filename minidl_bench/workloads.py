"""The datasets the ``loaders`` and ``overhead`` suites load: four kinds of per-sample work.

* ``PythonWorkload``: a pure-Python pixel loop, holding the GIL the whole time;
* ``NumpyWorkload``: crop, flip and normalise in-memory uint8 images with NumPy (releases the GIL in part);
* ``ImageFolderWorkload``: decode and augment JPEGs with Pillow (decoding releases the GIL), from a folder
  of generated images that ``image_folder()`` writes once into a cache outside the repository;
* ``IoWorkload``: ``time.sleep`` per sample, as reading from network storage, plus a small payload.

Each is a plain class with ``__len__`` and ``__getitem__``, so ``torch.utils.data.DataLoader`` and
``minidl.DataLoader`` load the very same object, and lives at module top level so spawn/forkserver
workers can import it. Random augmentation is seeded by the sample's index alone: every loader, worker
and worker method returns identical batches, which is what lets the suites check them before timing.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import numpy as np

MEAN = (0.485, 0.456, 0.406)  # ImageNet's channel statistics, as in torchvision's Normalize
STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 10
IMAGE_SET_VERSION = 1  # bump when image_folder() draws different images: the cache folder's name changes

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
    cache line moving between the cores: ``perf`` on 3.13t put 9.0% of the samples in ``_Py_DecRefShared``
    (0.04% with copies; ``results/threads/perf_decref.txt``). Notebook 09 measures both side by side.
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
    """JPEGs in class folders (``root/<class>/<file>.jpg``): decode, random-resized-crop to ``size``, flip.

    ``limit`` keeps the first ``limit`` files taken round-robin over the classes, so a short epoch still
    sees every class. Samples are CHW uint8 arrays, as torchvision's ``PILToTensor`` gives.
    """

    def __init__(self, root: str | Path, limit: int | None = None, size: int = 128) -> None:
        root = Path(root)
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        per_class = [sorted((root / c).glob("*.jpg")) for c in classes]
        # Round-robin over classes: file 0 of every class, then file 1 of every class, ...
        ranked = sorted((rank, label, path) for label, files in enumerate(per_class) for rank, path in enumerate(files))
        self.samples = [(str(path), label) for _, label, path in ranked[:limit]]
        self.classes, self.size = classes, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        from PIL import Image  # imported here: the other workloads run without Pillow

        path, label = self.samples[index]
        rng = np.random.default_rng(index)
        with Image.open(path) as img:
            img = img.convert("RGB")  # decodes the JPEG (Pillow releases the GIL while it decodes)
        width, height = img.size
        side = int(min(width, height) * rng.uniform(0.5, 1.0))
        x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(x, y, x + side, y + side))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1)), label


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


# --- the generated image folder -------------------------------------------------------------------

def cache_dir() -> Path:
    """Where generated data is kept between runs: ``$XDG_CACHE_HOME/minidl`` or ``~/.cache/minidl``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minidl"


def image_folder(per_class: int, name: str | None = None, seed: int = 0, cache: Path | None = None) -> Path:
    """An imagenette-like folder: 10 classes x ``per_class`` JPEGs, 320 pixels high, made once and reused.

    The images are smooth random colour fields plus noise (so they compress like photos, ~40 KB each),
    drawn from ``seed``, in ``cache / name`` (``cache_dir()``, ``images-v<version>`` by default). They are
    written to a temporary folder first and renamed into place, so a run that is interrupted, or two
    runs at once, never leave a half-made set behind.
    """
    from PIL import Image

    root = (cache or cache_dir()) / (name or f"images-v{IMAGE_SET_VERSION}")
    if root.is_dir():
        return root
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    rng = np.random.default_rng(seed)
    for label in range(NUM_CLASSES):
        folder = tmp / f"class_{label:02d}"
        folder.mkdir(parents=True)
        tint = rng.integers(-40, 41, size=3)  # each class leans towards its own colour
        for i in range(per_class):
            width = int(rng.integers(320, 481))
            coarse = np.clip(rng.integers(0, 256, size=(6, 8, 3)) + tint, 0, 255).astype(np.uint8)
            smooth = np.asarray(Image.fromarray(coarse).resize((width, 320), Image.Resampling.BICUBIC))
            noisy = smooth.astype(np.int16) + rng.normal(0, 10, size=smooth.shape).astype(np.int16)
            image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
            image.save(folder / f"{i:05d}.jpg", quality=90)
    try:
        tmp.rename(root)
    except OSError:  # another run finished the same set first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return root
