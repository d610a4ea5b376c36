"""minidl with NumPy alone: torch hidden from a subprocess, the package still imports and loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

# `None` in sys.modules makes `import torch` fail and find_spec("torch") answer None, exactly as
# when torch is not installed (free-threaded interpreters have no torch here). It must be set
# before anything imports minidl; worker processes inherit it under fork.
HIDE_TORCH = "import sys\nsys.modules['torch'] = None\n"


def run_without_torch(body: str) -> str:
    code = HIDE_TORCH + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_and_single_process_loader_without_torch():
    out = run_without_torch("""
        import numpy as np
        import minidl
        from minidl import _random
        assert not _random.HAS_TORCH
        data = minidl.TensorDataset(np.arange(10), np.arange(10) * 2.0)
        loader = minidl.DataLoader(data, batch_size=4, shuffle=True, collate_fn=minidl.numpy_collate,
                                   generator=np.random.default_rng(0))
        batches = list(loader)
        xs = np.concatenate([b[0] for b in batches])
        assert sorted(xs.tolist()) == list(range(10)) and isinstance(batches[0][0], np.ndarray)
        assert all((b[1] == b[0] * 2.0).all() for b in batches)
        again = [b[0].tolist() for b in minidl.DataLoader(data, batch_size=4, shuffle=True,
                 collate_fn=minidl.numpy_collate, generator=np.random.default_rng(0))]
        assert again == [b[0].tolist() for b in batches]
        print("ok", [len(b[0]) for b in batches], sys.modules["torch"] is not None)
    """)
    assert out.split() == ["ok", "[4,", "4,", "2]", "False"]


@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
def test_workers_without_torch(worker_method):
    out = run_without_torch(f"""
        import numpy as np
        import minidl
        from minidl_course import toy
        loader = minidl.DataLoader(toy.WorkerRandomDataset(12), batch_size=3, num_workers=2, shuffle=True,
                                   collate_fn=minidl.numpy_collate, worker_method={worker_method!r})
        batches = list(loader)
        idx = sorted(int(i) for b in batches for i in b[0])
        draws = [float(v) for b in batches for v in b[1]]
        assert idx == list(range(12)) and len(set(draws)) == 12
        print("ok", sys.modules["torch"] is not None)
    """)
    assert out.split() == ["ok", "False"]
