"""The prose of notebooks 01 to 05 against the numbers their committed full-mode run printed.

A chapter states a trend in words ("threads of pure Python keep about one core busy"); the cell beside it prints
the measurement. These tests read the committed outputs (never a run of their own: no timing is taken here) and
fail when a re-run commits numbers that no longer bear the words out, so the prose is changed with them.
Each test names the sentence it holds to the data.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = ("01_gil_threads_processes", "02_datasets_and_samplers", "03_collate", "04_single_process_loader",
            "05_workers")


def notebook(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def output_of(name: str, needle: str) -> str:
    """The text printed by the one code cell of ``name`` whose source holds ``needle``."""
    cells = [c for c in notebook(name).cells if c.cell_type == "code" and needle in c.source]
    assert len(cells) == 1, f"{name}: {len(cells)} code cells hold {needle!r}"
    return "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


def full_mode_01() -> bool:
    """Whether notebook 01's committed outputs come from a full-mode run: its last table says when they don't."""
    return "quick mode: not comparable" not in output_of("01_gil_threads_processes", "beside_reference(")


# --- what every chapter's screen holds --------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_harness_on_the_learners_screen(name):
    nb = notebook(name)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        shown = cell.source + "".join(o.get("text", "") for o in cell.outputs)
        assert "As expected on this run" not in shown and "expect(" not in cell.source
        assert "this run took" not in shown and "RUN_START" not in cell.source
        assert "full mode takes" not in shown


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_committed_output_holds_a_path_of_the_machine_that_ran_it(name):
    home = str(Path.home())
    repo = str(NOTEBOOKS.parent)
    for cell in notebook(name).cells:
        for out in cell.get("outputs", []):
            text = (out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
                    + "".join(out.get("traceback", [])))
            for path in (repo, home, "/tmp/", "site-packages"):
                assert path not in text, f"{name}: an output holds {path!r}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_cell_prints_more_than_a_screen(name):
    """A source listing or a harness's log would: excerpts and findings fit in 40 lines."""
    for i, cell in enumerate(notebook(name).cells):
        if cell.cell_type == "code":
            printed = "".join(o.get("text", "") for o in cell.outputs)
            assert printed.count("\n") <= 40, f"{name}: cell {i} prints {printed.count(chr(10))} lines"


# --- 01 -------------------------------------------------------------------------------------------------------


def test_01_threads_of_pure_python_keep_no_more_cores_busy_than_the_serial_loop():
    text = output_of("01_gil_threads_processes", "def cores_busy(fn, children=False)")
    threads = number(r"\d+ threads\s+: ([\d.]+)", text)
    assert threads < 1.3 and threads < 1.3 * number(r"serial loop : ([\d.]+) cores busy", text)


def test_01_waiting_threads_scale_past_the_cores():
    text = output_of("01_gil_threads_processes", 'io = {"serial": time_it(')
    assert number(r"threads x16 .*x([\d.]+)\n", text) > 2 * number(r"threads x2 .*x([\d.]+)\n", text)


def test_01_the_smallest_task_is_worth_less_than_its_trip_to_a_worker():
    text = output_of("01_gil_threads_processes", "per_task_us, speedup = [], {")
    assert number(r"pool: x([\d.]+) at the smallest task", text) < 0.8


def test_01_starting_processes_is_far_dearer_than_starting_threads():
    text = output_of("01_gil_threads_processes", 'startup = {f"pool x{N}": time_it(')
    assert number(r"starting processes took x([\d.]+) what starting threads took", text) > 3


def test_01_the_pool_verdict_names_noise_or_agrees_with_the_times():
    text = output_of("01_gil_threads_processes", 'gain = t_few.median / t_many.median')
    gain = number(r"\(x([\d.]+) with", text)
    assert "the times agree" in text or "is noise from other jobs" in text or "the times say little" in text
    if "about as busy either way" in text and not 0.9 <= gain <= 1.1:
        assert "noise" in text
    if "were busier" in text and gain < 1.1:
        assert "noise" in text


def test_01_spawn_pays_the_import_of_torch_that_fork_does_not():
    if not full_mode_01():
        pytest.skip("quick mode times only the default start method")
    text = output_of("01_gil_threads_processes", "startup.start_method_costs(methods, workers=2, epochs=1")
    fork = number(r"fork\s+first batch after ([\d.]+) s", text)
    spawn = number(r"spawn\s+first batch after ([\d.]+) s", text)
    assert spawn > 3 * fork
    assert number(r"spawn .* ran (\d+) time", text) >= 2  # one per worker
    assert number(r"fork .* ran (\d+) time", text) == 0


def test_01_vectorising_gains_far_more_than_the_cores():
    text = output_of("01_gil_threads_processes", 'cpu["numpy batch"] = time_it(')
    assert number(r"NumPy on the batch x([\d.]+)", text) > 5 * number(r"the best Pool x([\d.]+)", text)


# --- 03 -------------------------------------------------------------------------------------------------------


def test_03_default_convert_turns_a_tuple_into_a_list_as_the_text_says():
    text = output_of("03_collate", "default_convert of a tuple")
    assert re.search(r"default_convert of a tuple: \[tensor\(7\), 'id-7', \{'pixels': tensor", text)
    assert "same as torch's: True" in text


# --- 04 -------------------------------------------------------------------------------------------------------


def test_04_returning_the_made_batch_keeps_the_gain_that_re_collating_rows_gives_back():
    text = output_of("04_single_process_loader", "study = ch04.fetch_study(")
    rows = number(r"__getitems__ -> rows x([\d.]+)", text)
    made = number(r"__getitems__ -> batch x([\d.]+)", text)
    assert made > 1.5 * rows and made > 2
    assert number(r"rows still spent (\d+) µs a batch collating", text) > 5 * number(r"made batch (\d+) µs", text)


def test_04_the_made_batch_comes_out_of_torchs_loader_unchanged():
    text = output_of("04_single_process_loader", "made_loader = tud.DataLoader(")
    assert "torch's DataLoader, same batches as batch_size=4: True" in text


# --- 05 -------------------------------------------------------------------------------------------------------


def test_05_only_in_order_holds_batches_back():
    text = output_of("05_workers", "diagnoses = {in_order: traces[in_order].diagnose()")
    costs = [float(c) for c in re.findall(r"reordering cost (\d+) ms", text)]
    assert len(costs) == 2 and costs[0] > 0 and costs[1] == 0


def test_05_threads_of_pure_python_and_sleeping_threads():
    text = output_of("05_workers", "sweep = ch05.sweep(")
    assert number(r"CPU-bound, threads: best x([\d.]+)", text) < 1.8
    most = number(r"I/O-bound, (\d+) threads", text)
    assert number(r"I/O-bound, \d+ threads: x([\d.]+)", text) > 0.75 * most


def test_05_a_worker_loads_under_a_sleeping_step_and_only_adds_a_trip_without_one():
    text = output_of("05_workers", "overlap = ch05.overlap_study(")
    with_step = re.search(r"with the step\s+0 workers:\s+(\d+) ms.*1 worker :\s+(\d+) ms", text)
    assert with_step and float(with_step.group(2)) < 0.85 * float(with_step.group(1))


def test_05_persistent_workers_skip_the_second_start():
    text = output_of("05_workers", "startup.start_method_costs(methods, workers=2, epochs=2)")
    for method, again, kept in re.findall(r"(\w+): without persistent_workers epoch 2 waited ([\d.]+) s again; "
                                          r"with it ([\d.]+) s", text):
        assert float(kept) < float(again), method


def test_05_the_core_share_takeaway_follows_what_was_measured():
    text = output_of("05_workers", "share = ch05.core_share_study(")
    for gain, what in re.findall(r"workers x([\d.]+) over none: (.*)", text):
        gain = float(gain)
        assert ("ran under the step" in what) == (gain >= 1.1)
        assert ("slower" in what) == (gain <= 1 / 1.1)
