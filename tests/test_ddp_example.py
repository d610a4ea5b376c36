"""examples/ddp_train.py under torchrun: two ranks on loopback, minidl's shards against torch's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(loader: str, out: Path, epochs: int = 3) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(ROOT / "examples" / "ddp_train.py"), "--loader", loader,
           "--epochs", str(epochs), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    return {name: launch(name, base / name) for name in ("minidl", "torch")}


def test_shards_are_disjoint_and_cover_the_dataset_with_torch_padding(runs):
    n, world = 103, 2
    per_rank = -(-n // world)  # 52: the sampler pads 103 to 104 by repeating the first index
    for epoch in range(3):
        shards = [r["seen"][epoch] for r in runs["minidl"]]
        assert [len(s) for s in shards] == [per_rank, per_rank]
        together = shards[0] + shards[1]
        assert sorted(set(together)) == list(range(n))  # covers everything
        assert len(together) - len(set(together)) == per_rank * world - n  # only the padding repeats


def test_each_epoch_reshuffles(runs):
    seen = runs["minidl"][0]["seen"]
    assert seen[0] != seen[1] != seen[2]


def test_minidl_run_equals_the_torch_loader_run(runs):
    for ours, theirs in zip(runs["minidl"], runs["torch"]):
        assert ours["seen"] == theirs["seen"]
        assert ours["losses"] == theirs["losses"]  # bit-for-bit: same batches, same order
        assert ours["weight"] == theirs["weight"]


def test_ranks_end_with_the_same_model(runs):
    assert runs["minidl"][0]["weight"] == runs["minidl"][1]["weight"]
