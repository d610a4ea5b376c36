"""Tests for minidl_bench.plot's chart rules and for minidl_bench.replot, which redraws committed runs.

The rules: no bars on a log axis (dots there), bars and size axes from zero, a legend for
every colour, and the machine named in the caption. They are checked on matplotlib's Axes, both for the
helpers alone and for every figure drawn from the CSVs committed under ``results/``.
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import pytest

from minidl_bench import describe
from minidl_bench.harness import missing
from minidl_bench.timing import Timing

pytestmark = pytest.mark.skipif(bool(missing("matplotlib")), reason="the plots need matplotlib")

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results" / "x86_64-2c-py3.11-gil"


@pytest.fixture(autouse=True)
def _agg(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def t(median: float, spread: float = 0.1, repeats: int = 5) -> Timing:
    return Timing(median, median * (1 - spread), median * (1 + spread), repeats, median)


def bars(ax) -> list:
    from matplotlib.container import BarContainer

    return [c for c in ax.containers if isinstance(c, BarContainer)]


def check_rules(name: str, fig) -> None:
    """Every chart rule that can be read off a figure's Axes and texts."""
    ax = fig.axes[0]
    log = "log" in (ax.get_xscale(), ax.get_yscale())
    assert not (log and bars(ax)), f"{name}: bars on a log axis"
    if bars(ax):  # horizontal bars: their lengths run along x, which must start at zero
        assert ax.get_xlim()[0] == 0, name
    elif not ax.containers and ax.get_yscale() == "linear":  # a line plot (dots come in containers)
        assert ax.get_ylim()[0] == 0, name
    legend = ax.get_legend()
    assert legend is not None and legend.get_texts(), f"{name}: no legend"
    assert any("cores (" in text.get_text() for text in fig.texts), f"{name}: no machine in the caption"


# --- the helpers -----------------------------------------------------------------------------------

def test_bar_times_draws_bars_only_on_a_linear_axis_from_zero():
    from minidl_bench import plot

    fig = plot.bar_times({"a": t(0.5), "b": t(0.2)}, title="x", log=False)
    ax = fig.axes[0]
    assert len(bars(ax)) == 1 and ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0


def test_bar_times_with_log_draws_dots_not_bars():
    from minidl_bench import plot

    fig = plot.bar_times({"a": t(0.5), "b": t(0.002)}, title="x", log=True)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and not bars(ax)
    assert len(ax.containers) == 2  # one dot with its whiskers per label


@pytest.mark.parametrize("low, expect_log", [(0.2, False), (0.001, True)])
def test_bar_times_by_default_picks_dots_only_across_decades(low, expect_log):
    from minidl_bench import plot

    ax = plot.bar_times({"a": t(0.5), "b": t(low)}, title="x").axes[0]
    assert (ax.get_xscale() == "log") is expect_log
    assert bool(bars(ax)) is not expect_log


def test_dot_times_draws_a_one_off_call_hollow_and_says_so_in_the_legend():
    from minidl_bench import plot

    ax = plot.dot_times({"steady": t(0.01), "first call": t(0.5, 0, repeats=1)}, title="x").axes[0]
    dots = [c.lines[0] for c in ax.containers]
    assert dots[0].get_markerfacecolor() != "white" and dots[1].get_markerfacecolor() == "white"
    assert any("one first call" in text.get_text() for text in ax.get_legend().get_texts())


def test_groups_get_distinct_colours_each_named_in_the_legend():
    from matplotlib.colors import to_hex

    from minidl_bench import plot

    timings = {"x · torch": t(0.1), "x · minidl": t(0.2), "y · torch": t(0.3), "y · minidl": t(0.4)}
    groups = {k: k.split(" · ")[1] for k in timings}
    ax = plot.bar_times(timings, title="x", log=False, groups=groups).axes[0]
    colours = [to_hex(patch.get_facecolor()) for patch in bars(ax)[0]]
    assert colours[0] == colours[2] and colours[1] == colours[3] and colours[0] != colours[1]
    assert {"torch", "minidl"} <= {text.get_text() for text in ax.get_legend().get_texts()}


def test_the_baseline_is_grey_and_the_legend_names_it():
    from matplotlib.colors import to_hex

    from minidl_bench import plot

    ax = plot.bar_times({"serial": t(0.4), "threads": t(0.2)}, title="x", baseline="serial", log=False).axes[0]
    assert to_hex(bars(ax)[0][0].get_facecolor()) == plot.BASELINE != to_hex(bars(ax)[0][1].get_facecolor())
    assert any("baseline: serial" in text.get_text() for text in ax.get_legend().get_texts())


def test_line_plot_starts_the_y_axis_at_zero_unless_log():
    from minidl_bench import plot

    linear = plot.line_plot([0, 1, 2], {"a": [300, 320, 350], "b": [305, 310, 330]}, title="x", xlabel="w",
                            ylabel="MiB").axes[0]
    assert linear.get_ylim()[0] == 0 and linear.get_ylim()[1] >= 350
    log = plot.line_plot([1, 10], {"a": [0.1, 2.0]}, title="x", xlabel="w", ylabel="x", logy=True).axes[0]
    assert log.get_yscale() == "log" and log.get_ylim()[0] > 0


def test_line_plot_gives_every_series_its_own_colour():
    from minidl_bench import plot

    series = {f"s{i}": [i, i + 1] for i in range(12)}  # more than one palette of 10
    ax = plot.line_plot([0, 1], series, title="x", xlabel="w", ylabel="y").axes[0]
    plotted = [line for line in ax.lines if line.get_label() in series]
    assert len(plotted) == 12 and len({line.get_color() for line in plotted}) == 12
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(series)


# --- redrawing the committed runs ------------------------------------------------------------------

@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A copy of the committed GIL run's CSVs (no PNGs), so redrawing cannot touch results/."""
    folder = tmp_path_factory.mktemp("run") / RUN.name
    folder.mkdir()
    for csv_file in RUN.glob("*.csv"):
        shutil.copy(csv_file, folder)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replot_redraws_every_png_each_suite_lists_from_the_committed_csvs(committed, capsys):
    from minidl_bench import kernels, overhead, replot
    from minidl_bench.loaders import read_rows

    assert replot.main([str(committed)]) == 0
    written = {p.name for p in committed.glob("*.png")}
    workloads = dict.fromkeys(r["workload"] for r in read_rows(committed / "loaders_metrics.csv"))
    threads = dict.fromkeys(r["workload"] for r in read_rows(committed / "threads_metrics.csv"))
    listed = {*kernels.PLOTS, *overhead.PLOTS, "loaders_first_batch.png", "loaders_memory.png",
              *(f"loaders_throughput_{n}.png" for n in workloads), "threads_first_batch.png", "threads_memory.png",
              *(f"threads_speedup_{n}.png" for n in threads)}
    assert written == listed
    # ... and the committed PNGs are exactly these, but for the pipeline suite's, which replot doesn't redraw
    assert written == {p.name for p in RUN.glob("*.png") if not p.name.startswith("pipeline_")}
    assert all((committed / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in written)
    printed = capsys.readouterr().out
    assert all(f"wrote {committed / name}" in printed for name in written)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("suite", ["kernels", "loaders", "overhead", "threads"])
def test_every_committed_figure_keeps_the_chart_rules(committed, suite):
    from minidl_bench import replot

    figures = replot.SUITES[suite][1](committed)
    assert figures
    for name, fig in figures.items():
        check_rules(name, fig)


def test_the_caption_names_the_machine_in_the_csv_not_this_one(committed, tmp_path):
    from minidl_bench import replot

    folder = tmp_path / "run"
    folder.mkdir()
    text = (committed / "overhead.csv").read_text()
    original = next(csv.DictReader(io.StringIO(text)))["cpu_model"]  # the committed run's CPU (this one's, maybe)
    (folder / "overhead.csv").write_text(text.replace(original, "Test CPU 9000"))
    for fig in replot.overhead(folder).values():
        caption = " ".join(t.get_text() for t in fig.texts)
        assert "Test CPU 9000" in caption and original not in caption and describe() not in caption


def test_kernels_refuses_sizes_that_are_neither_full_nor_quick(committed, tmp_path):
    from minidl_bench import replot

    folder = tmp_path / "run"
    folder.mkdir()
    text = (committed / "kernels.csv").read_text().replace("kernels,cpu-normalise,128,", "kernels,cpu-normalise,99,")
    (folder / "kernels.csv").write_text(text)
    with pytest.raises(ValueError, match="neither the suite's FULL nor QUICK"):
        replot.kernels(folder)


def test_the_command_line_rejects_unknown_suites_and_missing_csvs(tmp_path, capsys):
    from minidl_bench import replot

    with pytest.raises(SystemExit):
        replot.main([str(tmp_path), "nonsense"])
    assert "unknown suite(s) nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replot.main([str(tmp_path), "kernels"])
    assert "no kernels.csv" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        replot.main([str(tmp_path)])
    assert "nothing to redraw" in capsys.readouterr().err
