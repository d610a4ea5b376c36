"""Real photographs for the course: JPEGs cut from the pictures that scikit-image and matplotlib ship.

``photo_folder()`` writes a few hundred of them once into a cache (nothing is downloaded: the sources are
files inside the installed packages); ``Photos`` is the map-style dataset that decodes them with Pillow;
``train_transform()`` is timm's ``create_loader`` augmentation for training (random-resized crop, flip,
uint8 CHW), written out. After collation (``minidl.prefetch.fast_collate``) a batch is normalised on the
device by ``PrefetchLoader``, or on the CPU by ``normalize``. Everything a worker runs lives here at module
top level, so spawn and forkserver workers can unpickle it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import minidl

PHOTO_SET_VERSION = 1  # bump when photo_folder() cuts different files: the cache folder's name changes
MEAN = (0.485, 0.456, 0.406)  # ImageNet's channel statistics (timm's IMAGENET_DEFAULT_MEAN / _STD)
STD = (0.229, 0.224, 0.225)
MARKER = "complete.json"  # written last: a folder without it is a half-made set, and is made again
SIDES = (400, 500)  # each file's width and height are drawn from this range: ImageNet-like sizes
QUALITY = 90  # JPEG quality, as ImageNet's files were saved at roughly

# (class name, package, file inside the installed package): the colour photographs the wheels carry.
# scikit-image fetches some of its other pictures with pooch on first use; those are never used here.
SOURCES = (
    ("astronaut", "skimage", "data/astronaut.png"),  # Eileen Collins, NASA
    ("cat", "skimage", "data/chelsea.png"),
    ("coffee", "skimage", "data/coffee.png"),
    ("galaxies", "skimage", "data/hubble_deep_field.jpg"),  # NASA, Hubble
    ("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    ("motorcycle", "skimage", "data/motorcycle_left.png"),
    ("retina", "skimage", "data/retina.jpg"),
    ("rocket", "skimage", "data/rocket.jpg"),  # SpaceX, public domain
    ("tissue", "skimage", "data/ihc.png"),  # immunohistochemistry stain
)
CLASSES = tuple(name for name, _, _ in SOURCES)

Sample = tuple[Any, int]  # (image, label)


# --- the photographs, cut once into a cache -------------------------------------------------------

def cache_dir() -> Path:
    """Where made data is kept between runs: ``$XDG_CACHE_HOME/minidl`` or ``~/.cache/minidl``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minidl"


def source_path(package: str, relative: str) -> Path:
    """The file ``relative`` inside the installed ``package`` (found without importing the package)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the course's photographs are files inside the {package} package, which is not installed: "
            "install the lab extra (pip install scikit-image==0.26.0 matplotlib==3.11.2)", name=package)
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but has no {relative}: is it the pinned version?")
    return path


def _variant(source, rng: np.random.Generator):
    """One new picture from ``source``: a random crop resized to ImageNet-like sides, maybe flipped."""
    from PIL import Image

    width, height = (int(v) for v in rng.integers(SIDES[0], SIDES[1] + 1, size=2))
    aspect = width / height
    src_w, src_h = source.size
    crop_h = rng.uniform(0.55, 1.0) * min(src_h, src_w / aspect)  # the tallest crop of this shape that fits, or less
    crop_w = crop_h * aspect
    left, top = rng.uniform(0, src_w - crop_w), rng.uniform(0, src_h - crop_h)
    image = source.resize((width, height), Image.Resampling.BICUBIC, box=(left, top, left + crop_w, top + crop_h))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image


def photo_folder(per_class: int = 32, seed: int = 0, cache: str | Path | None = None,
                 name: str | None = None) -> Path:
    """A folder ``<class>/<nnnn>.jpg`` of ``per_class`` JPEGs for each of the photographs in ``SOURCES``.

    Made once from ``seed`` into ``cache / name`` (``cache_dir()`` and a name saying version, size and
    seed by default) and reused: the files are written to a temporary folder, ``MARKER`` last, then
    renamed into place, and a folder without ``MARKER`` (a run killed half-way) is made again.
    """
    from PIL import Image

    if per_class < 1:
        raise ValueError(f"per_class should be a positive integer, got {per_class}")
    root = Path(cache or cache_dir()) / (name or f"photos-v{PHOTO_SET_VERSION}-{per_class}x{len(SOURCES)}-seed{seed}")
    if (root / MARKER).is_file():
        return root
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)  # half-made (no marker): start again
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for label, (cls, package, relative) in enumerate(SOURCES):
        with Image.open(source_path(package, relative)) as photo:
            photo = photo.convert("RGB")
        folder = tmp / cls
        folder.mkdir(parents=True)
        for i in range(per_class):
            rng = np.random.default_rng([seed, label, i])  # each file from its own stream: any subset is the same
            _variant(photo, rng).save(folder / f"{i:04d}.jpg", quality=QUALITY)
    files = sorted(tmp.glob("*/*.jpg"))
    summary = {"version": PHOTO_SET_VERSION, "per_class": per_class, "seed": seed, "files": len(files),
               "bytes": sum(f.stat().st_size for f in files), "classes": list(CLASSES)}
    (tmp / MARKER).write_text(json.dumps(summary, indent=1))
    try:
        tmp.rename(root)
    except OSError:  # another run finished the same set first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class Photos(minidl.Dataset):
    """The JPEGs of ``photo_folder()``: sample ``i`` is ``(image, label)``, the file decoded by Pillow.

    Without ``transform`` the image is a uint8 ``(3, H, W)`` array, each file at its own size; with one,
    whatever ``transform(pil_image)`` returns. Files are taken round-robin over the classes (file 0 of
    every class, then file 1, ...), so ``limit`` keeps the first ``limit`` and a short epoch sees every class.
    """

    def __init__(self, root: str | Path | None = None, transform: Callable | None = None,
                 limit: int | None = None) -> None:
        root = Path(root) if root is not None else photo_folder()
        if not (root / MARKER).is_file():
            raise FileNotFoundError(f"root {str(root)!r} is not a folder photo_folder() finished making")
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        ranked = sorted((rank, label, path) for label, cls in enumerate(self.classes)
                        for rank, path in enumerate(sorted((root / cls).glob("*.jpg"))))
        self.samples = [(str(path), label) for _, label, path in ranked[:limit]]
        self.root, self.transform = root, transform

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int):
        """Sample ``index`` as ``(PIL image in RGB, label)``: the file read and decoded, nothing else done."""
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label  # convert() decodes (Pillow releases the GIL while it does)

    def __getitem__(self, index: int) -> Sample:
        image, label = self.load(index)
        return (self.transform(image) if self.transform is not None else to_chw(image)), label


# --- timm's training transforms -------------------------------------------------------------------
# timm draws its augmentation from the process's global streams, which every DataLoader worker seeds
# from the loader's base seed (seed + worker id). A minidl thread worker cannot reseed the globals it
# shares, so it carries its own streams, seeded alike: worker_random() picks the right one. Either way a
# loader given the same generator gives the same batches in minidl and torch, with any number of workers.

def worker_random() -> Any:
    """The ``random`` stream of this worker: a minidl thread worker's own, else this process's global one.

    Both answer ``random()``, ``uniform()`` and ``randint()``: a ``random.Random``, or the ``random`` module.
    """
    info = minidl.get_worker_info()
    if info is not None and info.rng is not None:
        return info.rng.random_generator
    return random  # the module's functions draw from the global stream, which every worker seeds


class RandomResizedCrop:
    """Crop a random part (``scale`` of the area, aspect in ``ratio``), resize it to ``size`` x ``size``.

    timm's ``RandomResizedCropAndInterpolation`` with its defaults: ten tries at a box that fits, then
    the largest centred box within ``ratio``. The crop and resize are one Pillow call (``box=``).
    """

    def __init__(self, size: int = 224, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), interpolation: str = "bilinear") -> None:
        if not (0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"scale and ratio should be (low, high) ranges of positive numbers, got {scale}, {ratio}")
        self.size, self.scale, self.ratio, self.interpolation = size, scale, ratio, interpolation

    def get_params(self, width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
        """A box ``(top, left, height, width)`` inside a ``width`` x ``height`` image."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = rng.uniform(*self.scale) * area
            aspect = math.exp(rng.uniform(*log_ratio))  # uniform in log space: 3:4 as likely as 4:3
            w, h = round(math.sqrt(target_area * aspect)), round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                return rng.randint(0, height - h), rng.randint(0, width - w), h, w
        # No luck: the whole image, trimmed to the nearest aspect ratio allowed, centred.
        if width / height < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif width / height > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image, rng: random.Random | None = None):
        from PIL import Image

        top, left, h, w = self.get_params(*image.size, rng or worker_random())
        resample = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[self.interpolation]
        return image.resize((self.size, self.size), resample, box=(left, top, left + w, top + h))


class RandomHorizontalFlip:
    """Mirror the image left to right with probability ``p`` (timm uses torchvision's; this one needs no torch)."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image, rng: random.Random | None = None):
        from PIL import Image

        if (rng or worker_random()).random() < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image


def to_chw(image, rng: random.Random | None = None) -> np.ndarray:
    """A PIL image as a uint8 ``(C, H, W)`` array: timm's ``ToNumpy``, what ``fast_collate`` stacks."""
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return np.ascontiguousarray(array.transpose(2, 0, 1))


class Compose:
    """Apply ``transforms`` in turn, handing each the same random stream (``worker_random()`` unless given)."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image, rng: random.Random | None = None):
        rng = rng or worker_random()
        for transform in self.transforms:
            image = transform(image, rng)
        return image

    def __repr__(self) -> str:
        return f"Compose({self.transforms})"


def train_transform(size: int = 224, scale: tuple[float, float] = (0.08, 1.0),
                    ratio: tuple[float, float] = (3 / 4, 4 / 3), hflip: float = 0.5) -> Compose:
    """timm's training pipeline when it collates with ``fast_collate``: crop, flip, to uint8 CHW (no float yet)."""
    return Compose([RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(hflip), to_chw])


def normalize(images, mean: Sequence[float] = MEAN, std: Sequence[float] = STD):
    """A uint8 ``(N, C, H, W)`` batch as float32 ``(x - 255 mean) / (255 std)``: ``PrefetchLoader``'s step, on the CPU.

    Takes a tensor (returns one, equal to what ``PrefetchLoader(..., device="cpu")`` yields) or an array.
    """
    mean255, std255 = [m * 255 for m in mean], [s * 255 for s in std]
    if isinstance(images, np.ndarray):
        shape = (1, len(mean), 1, 1)
        m, s = np.array(mean255, np.float32).reshape(shape), np.array(std255, np.float32).reshape(shape)
        return (images.astype(np.float32) - m) / s
    import torch

    m = torch.tensor(mean255, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std255, dtype=torch.float32).view(1, -1, 1, 1)
    return images.to(torch.float32, copy=True).sub_(m).div_(s)


def denormalize(images, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> np.ndarray:
    """``normalize`` undone: a float ``(N, C, H, W)`` batch back to uint8 pixels, as an array."""
    images = np.asarray(images, dtype=np.float32)
    shape = (1, len(mean), 1, 1)
    pixels = images * (np.array(std, np.float32).reshape(shape) * 255) + np.array(mean, np.float32).reshape(shape) * 255
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


# --- one batch, seen ------------------------------------------------------------------------------

def show_batch(images, labels: Sequence[int] | None = None, classes: Sequence[str] = CLASSES, *,
               normalized: bool = False, mean: Sequence[float] = MEAN, std: Sequence[float] = STD,
               columns: int = 8, title: str | None = None):
    """A grid of one batch's images (uint8 ``(N, C, H, W)`` or ``normalized=True`` floats), titled by class name."""
    import matplotlib.pyplot as plt

    pixels = denormalize(images, mean, std) if normalized else np.asarray(images)
    if pixels.ndim != 4 or pixels.dtype != np.uint8:
        raise ValueError(f"images should be a uint8 (N, C, H, W) batch (or normalized=True floats), got "
                         f"{pixels.dtype} {pixels.shape}")
    n = len(pixels)
    rows = max(1, math.ceil(n / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(1.6 * columns, 1.75 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            ax.imshow(pixels[i].transpose(1, 2, 0))
            if labels is not None:
                ax.set_title(classes[int(labels[i])].replace("_", " "), fontsize=8)  # grace_hopper: in words
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # shown by returning it: no second copy from pyplot's own display
    return fig
