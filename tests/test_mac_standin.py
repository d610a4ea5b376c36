"""tests/mac_standin: the Mac stand-in `make mac` runs the notebooks in takes away what a Mac lacks, everywhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "mac_standin"

pytestmark = pytest.mark.timeout(180)


def run(code: str, standin: bool = True) -> dict:
    """``code`` as a script in a fresh interpreter (in the stand-in, or not); its last printed line, as JSON.

    A script, not ``-c``: a spawned child imports the parent's ``__main__`` from its file.
    """
    path = f"{ROOT}{os.pathsep}{STANDIN}" if standin else str(ROOT)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "script.py"
        script.write_text(code)
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150,
                             env=dict(os.environ, PYTHONPATH=path))
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


LOOK = """
import json, multiprocessing, os, pathlib, shutil
def refused(f):
    try:
        f()
    except FileNotFoundError:
        return True
    return False
def look():
    import psutil, torch.multiprocessing as tm
    try:
        tm.set_sharing_strategy("file_descriptor")
        said = None
    except (ValueError, AssertionError) as e:
        said = str(e)
    return {
        "start_method": multiprocessing.get_start_method(),
        "strategies": sorted(tm.get_all_sharing_strategies()), "default": tm.get_sharing_strategy(), "said": said,
        "fields": list(psutil.Process().memory_full_info()._fields),
        "children": len(psutil.Process().children()) >= 0,  # psutil's own /proc reads still work
        "affinity": hasattr(os, "sched_getaffinity"),
        "refused": [refused(lambda: open("/proc/self/status")), refused(lambda: os.listdir("/proc/self/fd")),
                    refused(lambda: os.listdir("/dev/shm")), refused(lambda: list(pathlib.Path("/proc").iterdir())),
                    refused(lambda: shutil.disk_usage("/dev/shm")), refused(lambda: os.readlink("/proc/self/exe")),
                    not os.path.exists("/proc/self/maps")],
        "other_files": len(os.listdir("/tmp")) >= 0 and open(os.devnull).read() == "",
    }
"""


def test_outside_it_this_linux_machine_shows_everything():
    got = run(LOOK + "print(json.dumps(look()))", standin=False)
    assert got["strategies"] == ["file_descriptor", "file_system"] and got["said"] is None
    assert "pss" in got["fields"] and got["affinity"] and not any(got["refused"])


def test_inside_it_a_process_sees_a_mac():
    got = run(LOOK + "print(json.dumps(look()))")
    assert got["start_method"] == "spawn"
    assert got["strategies"] == ["file_system"] and got["default"] == "file_system"
    assert got["said"] == "invalid sharing strategy 'file_descriptor', expected one of {'file_system'}"
    assert got["fields"] == ["rss", "vms", "pfaults", "pageins", "uss"]
    assert got["children"] and not got["affinity"] and got["other_files"]
    assert all(got["refused"]), got["refused"]


def test_a_spawned_worker_sees_the_same_mac():
    got = run(LOOK + "if __name__ == '__main__':\n"
                     "    with multiprocessing.Pool(1) as pool:\n"
                     "        print(json.dumps(pool.apply(look)))\n")
    assert got["strategies"] == ["file_system"] and got["fields"][-1] == "uss"
    assert all(got["refused"]) and not got["affinity"]


def test_a_minidl_loader_runs_in_it_with_file_system_sharing():
    got = run("import json, torch\n"
              "from minidl import DataLoader\n"
              "from minidl_course.sharing_demo import BlockDataset\n"
              "if __name__ == '__main__':\n"
              "    batches = list(DataLoader(BlockDataset(8, kib=4), batch_size=4, num_workers=2))\n"
              "    print(json.dumps([b.is_shared() for b in batches] + [float(batches[1][0, 0])]))\n")
    assert got == [True, True, 4.0]


def mac_run():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mac_run
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return mac_run


def code_and_checker(rel: str) -> str:
    """A notebook's code, with its exercise checker's module (the checker runs code too)."""
    cells = json.loads((ROOT / "notebooks" / rel).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    checkers = ROOT / "minidl_course" / "exercises"
    modules = {checkers / f"{m}.py" for m in re.findall(r"minidl_course\.exercises\.(\w+)", code)}
    if rel.startswith("exercises/"):  # exercises/ch01_nogil_threads.ipynb is checked by ch01_nogil.py
        modules |= {m for m in checkers.glob("ch*.py") if Path(rel).stem.startswith(m.stem)}
        assert modules, f"no checker module found for {rel}"
    return code + "".join(m.read_text() for m in sorted(modules))


def test_the_notebooks_make_mac_leaves_out_start_no_process_and_ask_the_platform_nothing():
    run_ = mac_run()
    assert run_.SKIPPED
    for rel in run_.SKIPPED:
        found = run_.PLATFORM_OR_PROCESS.findall(code_and_checker(rel))
        assert not found, (rel, found)
    # the pattern sees a checker's processes: ch05_worker_loop's checker starts workers
    assert run_.PLATFORM_OR_PROCESS.search(code_and_checker("exercises/ch05_worker_loop.ipynb"))


def cell(source: str, tags=(), error: tuple[str, str] | None = None) -> dict:
    outputs = [{"output_type": "error", "ename": error[0], "evalue": error[1], "traceback": []}] if error else []
    return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)}, "outputs": outputs}


YOUR_TURN = ("YourTurn", "your turn: write the code marked YOUR CODE HERE, then run this cell again")
SOLUTION = [cell("import minidl"), cell("loader = minidl.DataLoader(ds, num_workers=2)"), cell("check(mine)")]


@pytest.mark.parametrize("unfilled, repeats", [
    ([cell("import minidl"), cell("loader = minidl.DataLoader(ds, num_workers=2)"),
      cell("check(mine)", ["raises-exception"], YOUR_TURN)], True),
    ([cell("import minidl, numpy"), cell("loader = minidl.DataLoader(ds, num_workers=2)")], True),  # starts nothing
    # a cell of its own that starts workers
    ([cell("loader = minidl.DataLoader(ds, num_workers=4)")], False),
    # the solution's own cell, but it erred: it ran the learner's unfilled code
    ([cell("loader = minidl.DataLoader(ds, num_workers=2)", error=YOUR_TURN)], False),
    # stopped at YourTurn in a worker, not in the kernel
    ([cell("run_workers(mine, num_workers=2)", ["raises-exception"], ("YourTurn", "Caught YourTurn in worker 1"))],
     False),
])
def test_make_mac_leaves_out_an_unfilled_exercise_only_where_spawn_runs_nothing_its_solution_does_not(
        monkeypatch, unfilled, repeats):
    run_ = mac_run()
    monkeypatch.setattr(run_, "code_cells", lambda rel: SOLUTION if rel.endswith("_solution.ipynb") else unfilled)
    both = ["exercises/chX_task.ipynb", "exercises/chX_task_solution.ipynb"]
    assert run_.repeats_its_solution(both[0], both) is repeats
    assert not run_.repeats_its_solution(both[0], both[:1])  # its solution does not run here
    assert not run_.repeats_its_solution(both[1], both)  # a solution always runs


def test_the_unfilled_exercises_make_mac_runs_are_those_whose_learners_code_reaches_a_worker_or_the_platform():
    run_ = mac_run()
    rels = sorted(str(p.relative_to(ROOT / "notebooks")) for p in (ROOT / "notebooks" / "exercises").glob("*.ipynb"))
    kept = [r for r in rels if not r.endswith("_solution.ipynb") and not run_.repeats_its_solution(r, rels)]
    # ch05_worker_loop's unfilled worker loop raises YourTurn in its worker processes; the others read platform
    # facts (the machine's name, osfacts, the core count) in a cell of their own. The unfilled exercises left out
    # stop at YourTurn in the kernel, with the solution's cells before it.
    assert kept == [f"exercises/{name}.ipynb" for name in (
        "ch01_nogil_threads", "ch04_slow_sample", "ch05_worker_loop", "ch07_pinning_cost", "ch09_threads_or_processes",
        "ch10_overhead_ratio", "ch11_vectorise_or_workers", "ch12_pitfalls_debug")]


def test_torch_reports_apple_mps_and_both_loaders_turn_pinning_off():
    got = run("import json, warnings, torch, torch.utils.data as tud\n"
              "import minidl\n"
              "def said(loader):\n"
              "    with warnings.catch_warnings(record=True) as caught:\n"
              "        warnings.simplefilter('always')\n"
              "        pinned = [b[0].is_pinned() for b in loader]\n"
              "    return [str(w.message) for w in caught if 'pin_memory' in str(w.message)], any(pinned)\n"
              "if __name__ == '__main__':\n"
              "    data = torch.arange(8.0)\n"
              "    print(json.dumps([torch.backends.mps.is_available(), str(torch.accelerator.current_accelerator()),\n"
              "                      said(minidl.DataLoader(minidl.TensorDataset(data), batch_size=4,\n"
              "                                             pin_memory=True, num_workers=2)),\n"
              "                      said(tud.DataLoader(tud.TensorDataset(data), batch_size=4, pin_memory=True))]))\n")
    mps = "'pin_memory' argument is set as true but not supported on MPS now, device pinned memory won't be used."
    assert got == [True, "mps", [[mps], False], [[mps], False]]
