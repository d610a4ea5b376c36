"""`make lab` serves the course: JupyterLab starts headless and opens every notebook through its API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
TOKEN = "minidl-test-token"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, resp.read()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``make lab`` itself, on a loopback port with a known token and no browser."""
    home = tmp_path_factory.mktemp("lab")
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_DATA_DIR=str(home / "data"), HOME=str(home))
    log = open(home / "lab.log", "w")
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={TOKEN}"
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)  # its own process group: make and jupyter stop together
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if get(f"{base}/api/status")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (home / "lab.log").read_text()
            assert time.monotonic() < deadline, "make lab did not answer within 90 s"
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


def test_lab_page_is_served(lab):
    status, body = get(f"{lab}/lab")
    assert status == 200 and b"JupyterLab" in body


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_notebook_opens_through_the_contents_api(lab, path):
    rel = path.relative_to(ROOT / "notebooks").as_posix()
    status, body = get(f"{lab}/api/contents/{rel}?content=1&type=notebook")
    model = json.loads(body)
    assert status == 200 and model["type"] == "notebook"
    on_disk = json.loads(path.read_text())
    assert len(model["content"]["cells"]) == len(on_disk["cells"])
    assert model["content"]["metadata"].get("kernelspec", {}).get("name") == "python3"
