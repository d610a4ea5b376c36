"""Tests for minidl_course.photos: the cached photo folder, the dataset, timm's transforms, normalising, the grid.

The folder is made small here (2 files a class). The loader tests run under every start method
(`MINIDL_START_METHOD=spawn` / `forkserver` runs), with torch's DataLoader as the oracle. scikit-image is a
pinned dependency: without it the fixture fails with photo_folder()'s message, nothing is skipped.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import minidl
from minidl.prefetch import PrefetchLoader, fast_collate
from minidl_course import photos

PER_CLASS = 2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return photos.photo_folder(PER_CLASS, cache=tmp_path_factory.mktemp("photos"))


# --- the folder -------------------------------------------------------------------------------------

def test_folder_holds_jpegs_of_imagenet_like_sizes_in_one_folder_per_photograph(folder):
    files = sorted(folder.glob("*/*.jpg"))
    assert [p.parent.name for p in files] == [c for c in photos.CLASSES for _ in range(PER_CLASS)]
    for path in files:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert all(photos.SIDES[0] <= side <= photos.SIDES[1] for side in image.size), (path, image.size)
    summary = (folder / photos.MARKER).read_text()
    assert f'"files": {len(files)}' in summary


def test_folder_is_made_once_and_the_same_from_the_same_seed(folder, tmp_path):
    first = folder / photos.CLASSES[0] / "0000.jpg"
    stamp = first.stat().st_mtime_ns
    assert photos.photo_folder(PER_CLASS, cache=folder.parent) == folder  # found, not made again
    assert first.stat().st_mtime_ns == stamp
    again = photos.photo_folder(PER_CLASS, cache=tmp_path / "a")
    other_seed = photos.photo_folder(PER_CLASS, seed=1, cache=tmp_path / "b")
    smaller = photos.photo_folder(1, cache=tmp_path / "c")  # each file has its own stream: a smaller set is a subset
    for path in sorted(folder.glob("*/*.jpg")):
        relative = path.relative_to(folder)
        assert (again / relative).read_bytes() == path.read_bytes(), relative
        assert (other_seed / relative).read_bytes() != path.read_bytes(), relative
        assert relative.name != "0000.jpg" or (smaller / relative).read_bytes() == path.read_bytes(), relative


def test_a_half_made_folder_is_made_again(tmp_path):
    root = tmp_path / "set"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "0000.jpg").write_bytes(b"cut short")  # a run killed before it wrote the marker
    assert photos.photo_folder(1, cache=tmp_path, name="set") == root
    assert (root / photos.MARKER).is_file()
    assert len(list(root.glob("*/*.jpg"))) == len(photos.CLASSES)
    with Image.open(root / "cat" / "0000.jpg") as image:
        image.load()  # a whole JPEG now
    assert not list(tmp_path.glob("*.tmp-*"))  # nothing left beside it


def test_without_scikit_image_the_folder_cannot_be_made_and_says_what_to_install(tmp_path, monkeypatch):
    real = photos.importlib.util.find_spec
    monkeypatch.setattr(photos.importlib.util, "find_spec", lambda name: None if name == "skimage" else real(name))
    with pytest.raises(ModuleNotFoundError, match="pip install scikit-image=="):
        photos.photo_folder(1, cache=tmp_path)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="per_class"):
        photos.photo_folder(0, cache=tmp_path)
    with pytest.raises(FileNotFoundError, match="root"):
        photos.Photos(tmp_path)  # not a finished folder
    with pytest.raises(ValueError, match="scale and ratio"):
        photos.RandomResizedCrop(224, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="uint8"):
        photos.show_batch(np.zeros((2, 3, 8, 8), np.float32))  # floats, not said to be normalised


# --- the dataset ------------------------------------------------------------------------------------

def test_dataset_decodes_each_file_to_uint8_chw_round_robin_over_the_classes(folder):
    dataset = photos.Photos(folder)
    assert isinstance(dataset, minidl.Dataset) and len(dataset) == PER_CLASS * len(photos.CLASSES)
    assert dataset.classes == list(photos.CLASSES)
    assert [label for _, label in dataset.samples] == list(range(len(photos.CLASSES))) * PER_CLASS
    image, label = dataset[4]
    with Image.open(dataset.samples[4][0]) as pil:
        expected = np.asarray(pil.convert("RGB")).transpose(2, 0, 1)
    assert image.dtype == np.uint8 and image.flags.c_contiguous and np.array_equal(image, expected) and label == 4
    assert len(photos.Photos(folder, limit=5)) == 5


def test_transformed_samples_are_224_squares_drawn_from_the_stream_given(folder):
    dataset = photos.Photos(folder)
    transform = photos.train_transform()
    image, _ = dataset.load(0)
    a, b = transform(image, random.Random(3)), transform(image, random.Random(3))
    assert a.shape == (3, 224, 224) and a.dtype == np.uint8 and np.array_equal(a, b)
    assert not np.array_equal(a, transform(image, random.Random(4)))
    random.seed(5)
    c = transform(image)  # no stream given, outside a worker: the process's global one
    random.seed(5)
    assert np.array_equal(c, transform(image))
    assert pickle.loads(pickle.dumps(transform)).transforms[0].size == 224


# --- RandomResizedCrop's box ------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(0, 2**32 - 1),
       st.floats(0.01, 1.0), st.floats(0.2, 5.0))
def test_crop_box_lies_inside_the_image(width, height, seed, low, aspect):
    crop = photos.RandomResizedCrop(224, scale=(low, 1.0), ratio=(min(aspect, 1 / aspect), max(aspect, 1 / aspect)))
    top, left, h, w = crop.get_params(width, height, random.Random(seed))
    assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h >= 1 and w >= 1


@given(st.integers(1, 3000), st.integers(1, 3000))
def test_crop_falls_back_to_the_centred_box_of_an_allowed_aspect(width, height):
    crop = photos.RandomResizedCrop(224, scale=(2.0, 3.0))  # more than the whole image: no try can fit
    top, left, h, w = crop.get_params(width, height, random.Random(0))
    assert (top, left) == ((height - h) // 2, (width - w) // 2)
    assert h == height or w == width  # as large as the aspect limits allow
    if 3 / 4 <= width / height <= 4 / 3:
        assert (h, w) == (height, width)


def test_crop_of_the_whole_square_keeps_every_pixel():
    pixels = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    crop = photos.RandomResizedCrop(64, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert crop.get_params(64, 64, random.Random(0)) == (0, 0, 64, 64)
    assert np.array_equal(np.asarray(crop(Image.fromarray(pixels), random.Random(0))), pixels)


# --- the same batches as torch's DataLoader ---------------------------------------------------------

def one_epoch(backend: str, dataset, num_workers: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of a shuffled epoch, collated by fast_collate, from a loader seeded with ``seed``."""
    common = {"batch_size": 4, "shuffle": True, "num_workers": num_workers, "collate_fn": fast_collate,
              "generator": torch.Generator().manual_seed(seed)}
    if backend == "torch":
        loader = torch.utils.data.DataLoader(dataset, **common)
    else:
        loader = minidl.DataLoader(dataset, worker_method=backend.split()[1], **common)
    random.seed(1000 + seed)  # with no workers the transforms draw from this process's own stream
    return list(loader)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_augmented_batches_equal_torchs_for_the_same_seed(folder, num_workers, no_leaks):
    dataset = photos.Photos(folder, transform=photos.train_transform())
    expected = one_epoch("torch", dataset, num_workers)
    assert [len(y) for _, y in expected] == [4, 4, 4, 4, 2]
    assert all(x.dtype == torch.uint8 and x.shape[1:] == (3, 224, 224) for x, _ in expected)
    backends = ["minidl multiprocessing"] + (["minidl thread"] if num_workers else [])
    for backend in backends:
        got = one_epoch(backend, dataset, num_workers)
        assert len(got) == len(expected), backend
        for (x, y), (ex, ey) in zip(got, expected):
            assert torch.equal(y, ey) and torch.equal(x, ex), backend
    other = one_epoch("torch", dataset, num_workers, seed=1)
    assert not all(torch.equal(x, ex) for (x, _), (ex, _) in zip(other, expected))  # the seed does matter


# --- normalising, and back --------------------------------------------------------------------------

def test_normalize_on_the_cpu_equals_prefetch_loaders_and_undoes_exactly():
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, size=(3, 3, 5, 7), dtype=np.uint8))
    targets = torch.arange(3)
    (prefetched, _), = list(PrefetchLoader([(images, targets)], device="cpu"))
    ours = photos.normalize(images)
    assert ours.dtype == torch.float32 and torch.equal(ours, prefetched)
    assert np.array_equal(photos.normalize(images.numpy()), prefetched.numpy())
    assert images.dtype == torch.uint8 and int(images[0, 0, 0, 0]) == int(images.numpy()[0, 0, 0, 0])  # untouched
    assert np.array_equal(photos.denormalize(ours), images.numpy())


# --- the grid ---------------------------------------------------------------------------------------

def test_show_batch_draws_each_image_with_its_class(folder):
    dataset = photos.Photos(folder, transform=photos.train_transform(size=32))
    rng = random.Random(0)
    images, labels = fast_collate([(dataset.transform(dataset.load(i)[0], rng), dataset.samples[i][1])
                                   for i in range(10)])
    for fig in (photos.show_batch(images, labels, columns=4),
                photos.show_batch(photos.normalize(images), labels, columns=4, normalized=True)):
        drawn = [ax for ax in fig.axes if ax.get_images()]
        assert len(fig.axes) == 12 and len(drawn) == 10  # 3 rows of 4, two left empty
        for ax, image, label in zip(drawn, images.numpy(), labels.tolist()):
            assert np.array_equal(np.asarray(ax.get_images()[0].get_array()), image.transpose(1, 2, 0))
            assert ax.get_title() == photos.CLASSES[label].replace("_", " ")
    hopper = photos.CLASSES.index("grace_hopper")  # a class name with an underscore is titled in words
    fig = photos.show_batch(images[:1], [hopper])
    assert [ax.get_title() for ax in fig.axes if ax.get_images()] == ["grace hopper"]
