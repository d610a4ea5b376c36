"""Run every notebook the way a learner does: JupyterLab in headless Chromium, Run All, then look at the result.

    python scripts/browser_run.py [NOTEBOOK ...]        (what `make browser` runs; default: every notebook)

A copy of notebooks/ goes to a temporary folder (the committed notebooks are never saved over), JupyterLab serves
it on a free 127.0.0.1 port with a token, and for each notebook Chromium (Debian's package, driven by Playwright,
no browser download) opens it in JupyterLab's page, runs all cells in quick mode (MINIDL_QUICK=1 in the server's
environment reaches every kernel), waits until every cell has run, saves it, closes it and shuts its kernel down.
Each browser loads JupyterLab's page once and opens notebook after notebook in it (loading the app takes seconds);
after a notebook that failed, the next one gets a fresh page. A notebook fails on:

- an error in a cell not tagged ``raises-exception`` (a cell so tagged errs on purpose: an unfilled exercise's
  ``YourTurn`` line, or a lesson showing torch's own error), or cells left unrun because Run All stopped;
- a missing plot: a cell whose committed outputs hold an image that shows no image in the browser;
- an error in the browser's console, or an uncaught exception in the page.

Two notebooks run at a time (``--jobs``), each in a browser of its own against the one server: most of a
notebook's time is spent waiting on its kernel's workers. An exercise whose
checker times the learner's code against its own clock (``TIMED``) runs alone, after the rest, as in
``make mac``: beside another notebook its measurements, seconds apart, would see different machines.

Screenshots go to browser-out/ (ignored by git). The server and its kernels are stopped at the end, whatever
happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
NOTEBOOK_TIMEOUT = float(os.environ.get("BROWSER_NOTEBOOK_TIMEOUT", "900"))  # seconds for one Run All
TIMED = ("ch01", "ch05_keep_up", "ch07", "ch09", "ch10", "ch11", "ch12")  # exercises whose checkers time code


def timed_alone(rels: list[str]) -> list[str]:
    """The solution notebooks of the exercises whose checkers time code: they run alone, after the rest."""
    return [r for r in rels if r.startswith("exercises/") and r.removesuffix(".ipynb").endswith("_solution")
            and r.split("/")[-1].startswith(TIMED)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def start_lab(folder: Path, port: int, token: str, log) -> subprocess.Popen:
    env = dict(os.environ, MINIDL_QUICK="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--notebook-dir={folder}", "--expose-app-in-browser",
               "--ServerApp.open_browser=False", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
               "jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    server = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)  # its own process group: stopped whole at the end
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {server.returncode}; see {log.name}")
        try:
            api(base, token, "/api/status")
            return server
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer on {base} within 120 s; see {log.name}")


def stop_lab(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def images_in(cell: dict) -> bool:
    return any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


def report(rel: str, problems: list[str], seconds: float, failures: dict[str, list[str]]) -> None:
    """Print one notebook's verdict line and its problems; file them in ``failures`` (``make mac`` prints the same)."""
    verdict = "ok" if not problems else f"FAILED ({len(problems)})"
    print(f"{rel:60s} {verdict:12s} {seconds:6.1f} s", flush=True)
    for problem in problems:
        print(f"    {problem}", flush=True)
    if problems:
        failures[rel] = problems


def recap(failures: dict[str, list[str]]) -> None:
    """The failures again at the end, where a log's tail (all CI keeps of a long run) still shows them."""
    for rel, problems in failures.items():
        print(f"FAILED {rel}: {problems[0][:300]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def judge(committed: dict, ran: dict) -> list[str]:
    """What is wrong with the notebook as the browser ran and saved it, cell by cell."""
    problems = []
    cells = [(i, c, r) for i, (c, r) in enumerate(zip(committed["cells"], ran["cells"], strict=True))
             if c["cell_type"] == "code"]
    for i, cell, result in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        for out in result.get("outputs", []):
            if out.get("output_type") == "error" and "raises-exception" not in tags:
                problems.append(f"cell {i}: {out['ename']}: {out['evalue'][:300]}")
        if images_in(cell) and not images_in(result) and result.get("execution_count") is not None:
            problems.append(f"cell {i}: the committed outputs hold a plot, the browser's run shows none")
    unrun = [i for i, cell, result in cells if result.get("execution_count") is None and cell["source"]]
    if unrun:
        problems.append(f"cells {unrun[:5]}{'...' if len(unrun) > 5 else ''} never ran: Run All stopped early")
    return problems


OPEN = """async (rel) => {
    const w = await window.jupyterapp.commands.execute('docmanager:open', {path: rel, factory: 'Notebook'});
    await w.context.ready;
    await w.sessionContext.ready;
}"""
# The kernel is up once JupyterLab reports it idle; Run All before that would queue behind its start.
IDLE = ("() => { const w = window.jupyterapp.shell.currentWidget; const k = w && w.sessionContext &&"
        " w.sessionContext.session && w.sessionContext.session.kernel; return k && k.status === 'idle'; }")
# Outputs and execution counts are cleared first, so a cell has a count again only once it has run in this page.
RUN_ALL = """async () => {
    await window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs');
    window.jupyterapp.commands.execute('notebook:run-all-cells');
}"""
# The code cells (with code in them) still without an execution count, the kernel's status, and the prompts.
STATE = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const waiting = [...w.content.model.cells].filter(c => c.type === 'code' && c.sharedModel.getSource().trim()
                                                           && c.executionCount == null).length;
    const prompts = [...document.querySelectorAll('.jp-InputPrompt')].map(p => p.textContent).join('|');
    return [waiting, w.sessionContext.session.kernel.status, prompts];
}"""
SAVE = """async () => {
    const w = window.jupyterapp.shell.currentWidget;
    await window.jupyterapp.commands.execute('docmanager:save');
    return !w.context.model.dirty;
}"""
# Every notebook in the main area closed and its kernel shut down; a page that does not manage it in 60 s is replaced.
CLOSE = """async () => {
    const close = async () => {
        for (const w of [...window.jupyterapp.shell.widgets('main')]) {
            if (w.sessionContext) { await w.sessionContext.shutdown(); }
            w.dispose();
        }
        return 'closed';
    };
    return await Promise.race([close(), new Promise(resolve => setTimeout(() => resolve('timeout'), 60000))]);
}"""


def open_lab(context, base: str, token: str, console: list[str]):
    """One JupyterLab page, loaded once and reused for notebook after notebook (loading the app costs seconds)."""
    page = context.new_page()
    page.on("console", lambda m: console.append(f"console {m.type}: {m.text[:300]}") if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"page error: {e}"))
    page.goto(f"{base}/lab?reset&token={token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=120_000)
    page.evaluate("() => window.jupyterapp.restored")
    return page


def run_notebook(page, console: list[str], base: str, token: str, folder: Path, rel: str, shots: Path) -> list[str]:
    """Open notebooks/<rel> in the page, Run All, save, judge, close it and shut its kernel down."""
    console.clear()
    try:
        page.evaluate(OPEN, rel)
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=120_000)
        page.wait_for_function(IDLE, timeout=120_000)
        page.evaluate(RUN_ALL)
        # Done when every cell has run and the kernel is idle, twice in a row. When Run All stopped early (an error in
        # an untagged cell), some cells never run: then done once the kernel has been idle, nothing changing, for 3 s.
        deadline, quiet_since, last, finished = time.monotonic() + NOTEBOOK_TIMEOUT, None, None, 0
        while True:
            waiting, status, prompts = page.evaluate(STATE)
            now = time.monotonic()
            finished = finished + 1 if waiting == 0 and status == "idle" else 0
            settled = status == "idle" and "*" not in prompts and prompts == last
            quiet_since = (quiet_since or now) if settled else None
            if finished >= 2 or (quiet_since is not None and now - quiet_since >= 3):
                break
            if now > deadline:
                raise TimeoutError(f"Run All still running after {NOTEBOOK_TIMEOUT:.0f} s")
            last = prompts
            time.sleep(0.25)
        if not page.evaluate(SAVE):
            raise RuntimeError("the notebook was still unsaved after docmanager:save")
        committed = json.loads((ROOT / "notebooks" / rel).read_text())
        ran = json.loads((folder / rel).read_text())
        problems = judge(committed, ran)
        if any(images_in(c) for c in committed["cells"]) and page.locator(".jp-RenderedImage img").count() == 0:
            problems.append("no plot is shown in the page")
        page.screenshot(path=str(shots / (rel.replace("/", "__") + ".png")), full_page=True)
    except Exception as error:  # noqa: BLE001 -- a time-out or a page that broke: the notebook fails, the run goes on
        problems = [f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"]
        with contextlib.suppress(Exception):  # a page that crashed takes no screenshot
            page.screenshot(path=str(shots / (rel.replace("/", "__") + ".failed.png")), full_page=True)
    try:
        if page.evaluate(CLOSE) != "closed":
            problems.append("closing the notebook and shutting its kernel down took over 60 s")
    except Exception as error:  # noqa: BLE001 -- the page is replaced for the next notebook (run_queue)
        problems.append(f"closing the notebook: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
    for session in api(base, token, "/api/sessions"):  # this notebook's kernel, if the page left it running
        if session.get("path") == rel:
            api(base, token, f"/api/sessions/{session['id']}", method="DELETE")
    return problems + console


def run_queue(queue: list[str], base: str, token: str, run_one, done) -> None:
    """One browser of its own, on this thread (Playwright's sync API serves only the thread that started it), with
    one JupyterLab page running the queue's notebooks one after another until the queue is empty. A notebook that
    broke the page gets a fresh one for the next."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            console: list[str] = []
            page = None
            while True:
                try:
                    rel = queue.pop(0)  # list.pop is atomic: two threads never take the same notebook
                except IndexError:
                    return
                start = time.monotonic()
                if page is None:
                    page = open_lab(context, base, token, console)
                problems = run_one(page, console, rel)
                if problems:  # whatever went wrong stays with this notebook: the next one gets a fresh page
                    with contextlib.suppress(Exception):
                        page.close()
                    page = None
                done(rel, problems, time.monotonic() - start)
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="paths under notebooks/ (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks run at once (default 2)")
    args = parser.parse_args()

    every = (ROOT / "notebooks").rglob("*.ipynb")
    rels = args.notebooks or sorted(str(p.relative_to(ROOT / "notebooks")) for p in every
                                    if ".ipynb_checkpoints" not in str(p))
    rels = [r.removeprefix("notebooks/") for r in rels]
    if not Path(CHROMIUM).exists():
        print(f"browser_run: no Chromium at {CHROMIUM} (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    shots = ROOT / "browser-out"
    shots.mkdir(exist_ok=True)
    failures, lock = {}, threading.Lock()

    def done(rel: str, problems: list[str], seconds: float) -> None:
        with lock:
            report(rel, problems, seconds, failures)

    alone = timed_alone(rels)
    with tempfile.TemporaryDirectory(prefix="minidl-browser-") as tmp:
        folder = Path(tmp) / "notebooks"
        shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for name in ("pyproject.toml", "results"):  # notebooks find the committed results from the project's root
            (folder.parent / name).symlink_to(ROOT / name)
        port, token = free_port(), secrets.token_hex(16)

        base = f"http://127.0.0.1:{port}"

        def run_one(page, console: list[str], rel: str) -> list[str]:
            return run_notebook(page, console, base, token, folder, rel, shots)

        with open(shots / "jupyterlab.log", "w") as log:
            server = start_lab(folder, port, token, log)
            try:
                shared = [r for r in rels if r not in alone]
                jobs = max(1, args.jobs)
                with ThreadPoolExecutor(jobs) as pool:
                    for future in [pool.submit(run_queue, shared, base, token, run_one, done) for _ in range(jobs)]:
                        future.result()
                run_queue(list(alone), base, token, run_one, done)
            finally:
                stop_lab(server)
    recap(failures)
    print(f"{len(rels) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
