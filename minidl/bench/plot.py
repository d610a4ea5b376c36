"""The one plot helper that every notebook and ``python -m minidl.bench`` use.

Every figure gets labelled axes with units, a title, and a caption naming the machine (cores, CPU,
Python and its GIL build, torch, NumPy, Numba). The CLI picks matplotlib's non-interactive Agg
backend before this module is first imported; in Jupyter the inline backend draws the figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from minidl.bench.machine import describe
from minidl.bench.timing import Timing, format_seconds

UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}
BAR = "#3b75af"
BASELINE = "#9a9a9a"


def _plain(value: float, _pos: int | None = None) -> str:
    return f"{value:g}"


def pick_unit(seconds: float) -> str:
    """The largest unit in which ``seconds`` is at least 1 (``µs`` at the bottom)."""
    return next((u for u, scale in UNITS.items() if seconds >= scale), "µs")


def _finish(fig: Figure, ax, title: str, caption: str | None) -> Figure:
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            low, high = axis.get_view_interval()
            axis.set_major_formatter(FuncFormatter(_plain))  # 0.01, 1, 100 rather than 10^-2, 10^0, 10^2
            short = math.log10(high / low) < 2.5  # few decades: label the 2s and 5s between them too
            axis.set_minor_formatter(FuncFormatter(lambda v, _, short=short: _plain(v) if short and
                                                   f"{v:.0e}"[0] in "25" else ""))
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", axis="both", alpha=0.3)
    fig.text(0.01, 0.01, caption or describe(), fontsize=7, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def bar_times(timings: Mapping[str, Timing], *, title: str, what: str = "time", baseline: str | None = None,
              log: bool = True, caption: str | None = None, path: str | Path | None = None) -> Figure:
    """Horizontal bars of median time per label, whiskers from min to max, ``xN`` speedup vs ``baseline``.

    A Timing of a single call (``repeats == 1``, a JIT's first call) is drawn hatched: a one-off cost.
    """
    labels = list(timings)
    medians = [t.median for t in timings.values()]
    # A log axis spans decades, so pick the unit for the middle of them; a linear one for its end.
    unit = pick_unit(math.sqrt(min(medians) * max(medians)) if log else max(medians))
    scale = UNITS[unit]
    med = [timings[k].median / scale for k in labels]
    lo = [(timings[k].median - timings[k].min) / scale for k in labels]
    hi = [(timings[k].max - timings[k].median) / scale for k in labels]
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.42 * len(labels)))
    bars = ax.barh(range(len(labels)), med, xerr=[lo, hi], capsize=3, error_kw={"lw": 1},
                   color=[BASELINE if k == baseline else BAR for k in labels])
    for bar, k in zip(bars, labels):
        if timings[k].repeats == 1:
            bar.set(hatch="//", facecolor="white", edgecolor=BAR)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()  # first label on top, like the table it mirrors
    right = max(t.max for t in timings.values()) / scale
    for i, k in enumerate(labels):
        note = format_seconds(timings[k].median)
        if baseline is not None and k != baseline:
            note += f"  x{timings[baseline].median / timings[k].median:.2f}"
        end = timings[k].max / scale
        ax.text(end * 1.15 if log else end + right * 0.02, i, note, va="center", fontsize=8)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(med) / 2, right * 8)
    else:
        ax.set_xlim(0, right * 1.3)
    repeats = max(t.repeats for t in timings.values())
    legend = f"bar: median of {repeats} repeats, whiskers: min to max"
    if any(t.repeats == 1 for t in timings.values()):
        legend += ", hatched: one first call"
    if baseline is not None:
        legend += f"\nxN: N times as fast as {baseline}"
    ax.set_xlabel(f"{what} ({unit}{', log scale' if log else ''})\n{legend}", fontsize=9)
    return _save_if(_finish(fig, ax, title, caption), path)


def line_plot(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, xlabel: str,
              ylabel: str, logx: bool = False, logy: bool = False, hlines: Mapping[str, float] | None = None,
              caption: str | None = None, path: str | Path | None = None) -> Figure:
    """One line per series over a shared ``x``; ``hlines`` draws labelled reference lines (break-even)."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for label, y in series.items():
        ax.plot(x, y, marker="o", label=label)
    for label, level in (hlines or {}).items():
        ax.axhline(level, ls="--", lw=1, color="0.45")
        ax.annotate(label, (0.01, level), xycoords=("axes fraction", "data"), va="bottom", fontsize=8,
                    color="0.3")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=9)
    return _save_if(_finish(fig, ax, title, caption), path)


def save(fig: Figure, path: str | Path, close: bool = False) -> Path:
    """Write ``fig`` as a PNG at ``path`` (folders made as needed); ``close`` frees it afterwards."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    if close:
        plt.close(fig)
    return path


def _save_if(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        save(fig, path)
    return fig
