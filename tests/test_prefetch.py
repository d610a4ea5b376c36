"""PrefetchLoader and fast_collate: normalisation checked against NumPy by hand, batch order, and on CUDA
(``gpu`` marker) the side stream: pinned inputs, results equal to the CPU's, no use-after-free."""

from __future__ import annotations

import functools
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import minidl  # noqa: E402
from minidl.prefetch import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PrefetchLoader, fast_collate  # noqa: E402

MEAN = np.array(IMAGENET_DEFAULT_MEAN)
STD = np.array(IMAGENET_DEFAULT_STD)


def uint8_batches(n_batches=5, batch_size=4, shape=(3, 8, 6), seed=0):
    """A list of ``(images uint8 (B, C, H, W), targets int64)`` batches; targets number the samples 0, 1, 2, ..."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (batch_size, *shape), dtype=torch.uint8, generator=g),
             torch.arange(i * batch_size, (i + 1) * batch_size)) for i in range(n_batches)]


def normalise_by_hand(images: torch.Tensor, mean=MEAN, std=STD, dtype=np.float32) -> np.ndarray:
    """(x - mean*255) / (std*255) per channel, in NumPy, in ``dtype``."""
    scale = np.array([m * 255 for m in mean], dtype=dtype).reshape(1, -1, 1, 1)
    spread = np.array([s * 255 for s in std], dtype=dtype).reshape(1, -1, 1, 1)
    return (images.numpy().astype(dtype) - scale) / spread


# --- CPU: the same steps without streams --------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cpu_fallback_normalises_like_the_formula(device):
    batches = uint8_batches()
    prefetcher = PrefetchLoader(batches, device=device)
    expected_device = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    out = list(prefetcher)
    assert len(out) == len(batches)
    for (images, targets), (raw, raw_targets) in zip(out, batches):
        assert images.device.type == expected_device and images.dtype == torch.float32
        assert targets.dtype == torch.int64 and torch.equal(targets.cpu(), raw_targets)
        np.testing.assert_allclose(images.cpu().numpy(), normalise_by_hand(raw), rtol=1e-6, atol=1e-6)


def test_parameters_come_in_timms_order():
    # timm's PrefetchLoader(loader, mean, std, channels, device, img_dtype, fp16, re_...): a positional
    # call written for timm must bind the same way here. random_erasing replaces timm's re_* knobs.
    import inspect

    names = list(inspect.signature(PrefetchLoader).parameters)
    assert names == ["loader", "mean", "std", "channels", "device", "img_dtype", "fp16", "random_erasing"]
    (images, _), = PrefetchLoader(uint8_batches(1, shape=(2, 4, 4)), (0.5, 0.5), (0.25, 0.25), 2, "cpu")
    assert images.shape[1] == 2


@pytest.mark.parametrize(("img_dtype", "fp16", "expected"), [
    (None, False, torch.float32), (torch.float64, False, torch.float64), (torch.float64, True, torch.float16),
])
def test_img_dtype_sets_the_output_dtype_and_fp16_overrides_it_as_in_timm(img_dtype, fp16, expected):
    batches = uint8_batches(2)
    for (images, _), (raw, _) in zip(PrefetchLoader(batches, device="cpu", img_dtype=img_dtype, fp16=fp16), batches):
        assert images.dtype == expected
        np.testing.assert_allclose(images.double().numpy(), normalise_by_hand(raw), rtol=2e-3, atol=2e-3)


def test_fp16_gives_half_precision_close_to_the_float32_formula():
    batches = uint8_batches()
    for (images, _), (raw, _) in zip(PrefetchLoader(batches, device="cpu", fp16=True), batches):
        assert images.dtype == torch.float16
        by_hand16 = normalise_by_hand(raw, dtype=np.float16)
        np.testing.assert_allclose(images.numpy().astype(np.float32), by_hand16.astype(np.float32), rtol=0, atol=2e-3)
        np.testing.assert_allclose(images.numpy().astype(np.float32), normalise_by_hand(raw), rtol=2e-3, atol=2e-3)


def test_custom_statistics_scalar_and_per_channel():
    batches = uint8_batches(n_batches=2, shape=(2, 4, 4))
    for mean, std in [(0.5, 0.25), ((0.1, 0.9), (0.3, 0.6))]:
        m = np.broadcast_to(mean, (2,))
        s = np.broadcast_to(std, (2,))
        prefetcher = PrefetchLoader(batches, mean=mean, std=std, channels=2, device="cpu")
        for (images, _), (raw, _) in zip(prefetcher, batches):
            np.testing.assert_allclose(images.numpy(), normalise_by_hand(raw, m, s), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="expected 3 per-channel values, got 2"):
        PrefetchLoader(batches, mean=(0.1, 0.2), device="cpu")


def test_every_batch_exactly_once_in_order_one_batch_ahead():
    fetched = []

    def source():
        for batch in uint8_batches(n_batches=6):
            fetched.append(int(batch[1][0]) // 4)
            yield batch

    it = iter(PrefetchLoader(source(), device="cpu"))
    first = next(it)
    assert fetched == [0, 1]  # batch 0 is handed out only once batch 1 has been queued behind it
    seen = [int(first[1][0]) // 4] + [int(targets[0]) // 4 for _, targets in it]
    assert seen == list(range(6)) and fetched == list(range(6))


@pytest.mark.parametrize("n_batches", [0, 1, 2])
def test_short_loaders(n_batches):
    out = list(PrefetchLoader(uint8_batches(n_batches), device="cpu"))
    assert [t.tolist() for _, t in out] == [t.tolist() for _, t in uint8_batches(n_batches)]


def test_the_loaders_own_batches_are_not_modified():
    batches = [(torch.rand(2, 3, 4, 4) * 255, torch.arange(2))]  # float already: .to(float32) is a no-op
    before = batches[0][0].clone()
    (images, _), = PrefetchLoader(batches, device="cpu")
    assert torch.equal(batches[0][0], before)
    np.testing.assert_allclose(images.numpy(), (before.numpy() - MEAN.reshape(1, 3, 1, 1) * 255)
                               / (STD.reshape(1, 3, 1, 1) * 255), rtol=1e-5, atol=1e-5)


def test_random_erasing_runs_on_each_normalised_batch():
    calls = []

    def erase_first_sample(x):
        calls.append(x.clone())
        x = x.clone()
        x[0] = 0
        return x

    batches = uint8_batches(n_batches=3)
    out = list(PrefetchLoader(batches, device="cpu", random_erasing=erase_first_sample))
    assert len(calls) == 3
    for seen, (images, _), (raw, _) in zip(calls, out, batches):
        np.testing.assert_allclose(seen.numpy(), normalise_by_hand(raw), rtol=1e-6, atol=1e-6)
        assert torch.all(images[0] == 0)
        np.testing.assert_allclose(images[1:].numpy(), normalise_by_hand(raw)[1:], rtol=1e-6, atol=1e-6)


def test_len_sampler_and_dataset_pass_through():
    dataset = minidl.TensorDataset(torch.zeros(10, 3, 2, 2, dtype=torch.uint8), torch.arange(10))
    loader = minidl.DataLoader(dataset, batch_size=3)
    prefetcher = PrefetchLoader(loader, device="cpu")
    assert len(prefetcher) == len(loader) == 4
    assert prefetcher.sampler is loader.sampler and prefetcher.dataset is dataset
    assert len(list(prefetcher)) == 4


def test_with_a_dataloader_and_fast_collate_over_thread_workers():
    images = np.random.default_rng(0).integers(0, 256, size=(10, 6, 5, 3), dtype=np.uint8)  # HWC
    samples = [(images[i], i) for i in range(10)]
    loader = minidl.DataLoader(samples, batch_size=4, num_workers=2, worker_method="thread",
                               collate_fn=functools.partial(fast_collate, channels_last=True))
    out = list(PrefetchLoader(loader, device="cpu"))
    got = torch.cat([x for x, _ in out]).numpy()
    chw = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    np.testing.assert_allclose(got, normalise_by_hand(chw), rtol=1e-6, atol=1e-6)
    assert torch.cat([t for _, t in out]).tolist() == list(range(10))


def test_importing_minidl_imports_neither_prefetch_nor_torch():
    code = "import sys, minidl; print('minidl.prefetch' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --- fast_collate -------------------------------------------------------------------------------

def hand_stacked(images, channels_last):
    """The reference: a plain NumPy stack, channels moved first by hand."""
    arrays = [np.asarray(im) for im in images]
    if arrays[0].ndim == 2:
        arrays = [a[np.newaxis] for a in arrays]
    elif channels_last:
        arrays = [np.transpose(a, (2, 0, 1)) for a in arrays]
    return np.stack(arrays)


LAYOUTS = {
    "numpy CHW": (lambda rng: rng.integers(0, 256, size=(3, 5, 4), dtype=np.uint8), False),
    "numpy HWC": (lambda rng: rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8), True),
    "numpy HW": (lambda rng: rng.integers(0, 256, size=(5, 4), dtype=np.uint8), False),
    "tensor CHW": (lambda rng: torch.from_numpy(rng.integers(0, 256, size=(3, 5, 4), dtype=np.uint8)), False),
    "tensor HWC": (lambda rng: torch.from_numpy(rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)), True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_collate_matches_a_hand_stacked_batch(layout):
    make, channels_last = LAYOUTS[layout]
    rng = np.random.default_rng(1)
    samples = [(make(rng), 10 + i) for i in range(5)]
    images, targets = fast_collate(samples, channels_last=channels_last)
    reference = hand_stacked([im for im, _ in samples], channels_last)
    assert images.dtype == torch.uint8 and images.ndim == 4 and images.is_contiguous()
    assert tuple(images.shape) == reference.shape and reference.shape[:2] in {(5, 3), (5, 1)}
    np.testing.assert_array_equal(images.numpy(), reference)
    assert targets.dtype == torch.int64 and targets.tolist() == [10, 11, 12, 13, 14]


def test_fast_collate_owns_its_memory_and_reads_read_only_arrays_without_warning():
    frozen = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    frozen.setflags(write=False)  # what np.asarray(pil_image) returns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        images, _ = fast_collate([(frozen, 0), (frozen, 1)], channels_last=True)
    assert not caught, [str(w.message) for w in caught]
    images[0, 0, 0, 0] = 255
    assert frozen[0, 0, 0] == 0  # the batch is a copy, not a view of the sample


@pytest.mark.parametrize("image", [np.zeros((3, 4, 4), np.float32), torch.zeros(3, 4, 4)],
                         ids=["numpy float32", "tensor float32"])
def test_fast_collate_refuses_float_images(image):
    with pytest.raises(TypeError, match="uint8"):
        fast_collate([(image, 0)])


def test_fast_collate_refuses_ragged_images():
    with pytest.raises(ValueError):
        fast_collate([(np.zeros((3, 4, 4), np.uint8), 0), (np.zeros((3, 4, 5), np.uint8), 1)])


# --- CUDA: streams, pinned memory, the caching allocator ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("num_workers,worker_method", [(0, "multiprocessing"), (2, "multiprocessing"), (2, "thread")])
def test_dataloader_pin_memory_gives_pinned_batches(num_workers, worker_method):
    dataset = minidl.TensorDataset(torch.arange(24.0).view(12, 2), torch.arange(12))
    loader = minidl.DataLoader(dataset, batch_size=4, pin_memory=True, num_workers=num_workers,
                               worker_method=worker_method)
    batches = list(loader)
    assert len(batches) == 3
    for i, (x, y) in enumerate(batches):
        assert x.is_pinned() and y.is_pinned()
        assert torch.equal(y, torch.arange(4 * i, 4 * i + 4))


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [False, True])
def test_prefetch_on_cuda_equals_the_cpu_path(fp16):
    batches = [(x.pin_memory(), y.pin_memory()) for x, y in uint8_batches(n_batches=6, batch_size=8)]
    on_gpu = list(PrefetchLoader(batches, device="cuda", fp16=fp16))
    on_cpu = list(PrefetchLoader(batches, device="cpu", fp16=fp16))
    assert len(on_gpu) == len(on_cpu) == 6
    for (gx, gy), (cx, cy) in zip(on_gpu, on_cpu):
        assert gx.is_cuda and gy.is_cuda and gx.dtype == cx.dtype
        assert torch.equal(gy.cpu(), cy)
        torch.testing.assert_close(gx.cpu(), cx, rtol=0, atol=1e-3 if fp16 else 1e-5)


def _stress(n_steps=120, batch_size=32, sleep_cycles=20_000_000):
    """Run a PrefetchLoader over a pinned DataLoader while the consumer keeps the default stream busy.

    Each step the consumer queues a long ``torch.cuda._sleep`` and then a comparison of its batch with
    the expected one, and drops the batch at once, so the batch's memory is freed (as far as Python
    knows) long before the GPU reads it. If the allocator reused that memory for a later batch, the
    comparison would see the later batch's values. Returns, per step, the largest error seen.
    """
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_steps * batch_size, 3, 32, 32), dtype=torch.uint8, generator=g)
    loader = minidl.DataLoader(minidl.TensorDataset(images, torch.arange(n_steps * batch_size)),
                               batch_size=batch_size, pin_memory=True)
    expected = list(PrefetchLoader([(images, torch.arange(len(images)))], device="cpu"))[0][0]
    expected = expected.view(n_steps, batch_size, 3, 32, 32).cuda()
    errors = torch.zeros(n_steps, device="cuda")
    torch.cuda.synchronize()
    for step, (x, y) in enumerate(PrefetchLoader(loader, device="cuda")):
        torch.cuda._sleep(sleep_cycles)  # the consumer's "training step": the default stream is busy
        errors[step] = (x - expected[step]).abs().amax() + (y - torch.arange(batch_size, device="cuda")
                                                            - step * batch_size).abs().amax()
        del x, y  # a training loop lets go of its batch as soon as the step is queued
        if step % 25 == 24:
            torch.cuda.empty_cache()  # hand free blocks back to CUDA: reuse must still wait for readers
    torch.cuda.synchronize()
    return errors.cpu()


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_caching_allocator_stress_no_use_after_free():
    errors = _stress()
    assert errors.numel() == 120
    bad = torch.nonzero(errors > 1e-5).flatten().tolist()
    assert not bad, f"corrupted batches at steps {bad[:10]} (max error {errors.max():.3g})"


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_the_stress_loop_catches_a_missing_record_stream(monkeypatch):
    # The control experiment: with record_stream switched off the same loop must see corruption,
    # or the test above could not fail.
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    errors = _stress()
    assert (errors > 1e-5).any(), "no corruption without record_stream: the stress loop is too gentle"
