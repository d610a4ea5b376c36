"""The one plot helper that every notebook and ``python -m minidl_bench`` use.

Every figure gets labelled axes with units, a title, a legend for every colour and marker it uses, and
a caption naming the machine (cores, CPU, Python and its GIL build, torch, NumPy, Numba). Sizes are
compared from zero: bars only on a linear axis that starts at zero, a dot plot where times span decades
and need a log axis, and line plots whose y-axis starts at zero unless asked for a log one. The CLI picks
matplotlib's non-interactive Agg backend before this module is first imported; in Jupyter the inline
backend draws the figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from minidl_bench.machine import describe
from minidl_bench.timing import Timing, format_seconds

UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}
BAR = "#3b75af"
BASELINE = "#9a9a9a"
GROUP_COLOURS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e", "#d57fbe", "#bcbc45")
MARKERS = "osD^vP*Xph<>"  # a second cue beside colour, where lines cross or overlap


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


def spans_decades(timings: Mapping[str, Timing], ratio: float = 30.0) -> bool:
    """Whether the slowest max is over ``ratio`` times the fastest median: too wide for one linear axis."""
    return max(t.max for t in timings.values()) > ratio * min(t.median for t in timings.values())


def _notes(ax, timings: Mapping[str, Timing], baseline: str | None, at: Sequence[float]) -> None:
    """Each row's median (and ``xN`` against the baseline) written just right of its whisker at ``at``."""
    for i, (k, x) in enumerate(zip(timings, at)):
        note = format_seconds(timings[k].median)
        if baseline is not None and k != baseline:
            note += f"  x{timings[baseline].median / timings[k].median:.2f}"
        ax.text(x, i, note, va="center", fontsize=8)


def _colours(timings: Mapping[str, Timing], baseline: str | None, groups: Mapping[str, str] | None) -> list[str]:
    """Each row's colour: grey for the baseline, else its group's own colour (one colour with no groups)."""
    palette = dict(zip(dict.fromkeys((groups or {}).values()), GROUP_COLOURS))
    return [BASELINE if k == baseline else palette.get((groups or {}).get(k), BAR) for k in timings]


def _legend(ax, timings: Mapping[str, Timing], baseline: str | None, marker: str | None,
            groups: Mapping[str, str] | None = None) -> None:
    """A legend for every state drawn: each group's colour (or the one), baseline, one first call, whiskers."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def swatch(label: str, face: str, edge: str, hatch: str | None = None):
        if marker is None:
            return Patch(facecolor=face, edgecolor=edge, hatch=hatch, label=label)
        return Line2D([], [], ls="none", marker=marker, markersize=8, markerfacecolor=face, markeredgecolor=edge,
                      label=label)

    repeats = max(t.repeats for t in timings.values())
    shape = "bar" if marker is None else "dot"
    if groups:
        palette = dict(zip(dict.fromkeys(groups.values()), GROUP_COLOURS))
        handles = [swatch(group, colour, colour) for group, colour in palette.items()]
        handles.append(Line2D([], [], ls="none", label=f"{shape}: median of {repeats} repeats"))
    else:
        handles = [swatch(f"median of {repeats} repeats", BAR, BAR)]
    if baseline is not None:
        handles.append(swatch(f"baseline: {baseline} (xN: N times as fast)", BASELINE, BASELINE))
    if any(t.repeats == 1 for t in timings.values()):
        handles.append(swatch("one first call (a one-off cost)", "white", BAR, "//"))
    handles.append(Line2D([], [], color="black", lw=1, marker="|", markersize=8, label="whiskers: min to max"))
    ax.legend(handles=handles, fontsize=8, ncols=2, frameon=False, loc="upper center",
              bbox_to_anchor=(0.5, -0.06 - 0.45 / ax.figure.get_figheight()))


def _rows(timings: Mapping[str, Timing], log: bool) -> tuple[Figure, object, str, list[float], list[list[float]]]:
    """The figure, its axes, the unit, and each row's median and whisker lengths in that unit."""
    medians = [t.median for t in timings.values()]
    # A log axis spans decades, so pick the unit for the middle of them; a linear one for its end.
    unit = pick_unit(math.sqrt(min(medians) * max(medians)) if log else max(medians))
    scale = UNITS[unit]
    med = [t.median / scale for t in timings.values()]
    err = [[(t.median - t.min) / scale for t in timings.values()],
           [(t.max - t.median) / scale for t in timings.values()]]
    fig, ax = plt.subplots(figsize=(8, 2.2 + 0.42 * len(timings)))
    ax.set_yticks(range(len(timings)), list(timings))
    ax.invert_yaxis()  # first label on top, like the table it mirrors
    return fig, ax, unit, med, err


def dot_times(timings: Mapping[str, Timing], *, title: str, what: str = "time", baseline: str | None = None,
              groups: Mapping[str, str] | None = None, caption: str | None = None,
              path: str | Path | None = None) -> Figure:
    """A dot per label at its median time on a log axis, whiskers from min to max, ``xN`` speedup vs ``baseline``.

    For times that span decades, where bars would mislead: a bar's length on a log axis says nothing.
    A Timing of a single call (``repeats == 1``, a JIT's first call) is drawn as a hollow dot. ``groups``
    maps labels to a state (a backend, say): each state gets its own colour and legend entry.
    """
    fig, ax, unit, med, err = _rows(timings, log=True)
    for i, (t, colour) in enumerate(zip(timings.values(), _colours(timings, baseline, groups))):
        ax.errorbar(med[i], i, xerr=[[err[0][i]], [err[1][i]]], fmt="o", markersize=8, capsize=3, lw=1,
                    color="black", markerfacecolor="white" if t.repeats == 1 else colour, markeredgecolor=colour,
                    zorder=3)
    scale = UNITS[unit]
    right = max(t.max for t in timings.values()) / scale
    _notes(ax, timings, baseline, [t.max / scale * 1.15 for t in timings.values()])
    ax.set_xscale("log")
    ax.set_xlim(min(t.min for t in timings.values()) / scale / 2, right * 8)
    ax.set_ylim(len(timings) - 0.5, -0.5)
    ax.set_xlabel(f"{what} ({unit}, log scale)", fontsize=9)
    _legend(ax, timings, baseline, "o", groups)
    return _save_if(_finish(fig, ax, title, caption), path)


def bar_times(timings: Mapping[str, Timing], *, title: str, what: str = "time", baseline: str | None = None,
              log: bool | None = None, caption: str | None = None, path: str | Path | None = None,
              groups: Mapping[str, str] | None = None) -> Figure:
    """Horizontal bars of median time per label from zero, whiskers from min to max, ``xN`` speedup vs ``baseline``.

    Bars only on a linear axis that starts at zero, where their lengths compare. ``log=True`` draws
    ``dot_times`` instead (a log axis for times that span decades); ``log=None`` picks that when the
    times span more than ``spans_decades`` allows. A single call (``repeats == 1``) is drawn hatched.
    ``groups`` maps labels to a state (a backend, say): each state gets its own colour and legend entry.
    """
    if log is None:
        log = spans_decades(timings)
    if log:
        return dot_times(timings, title=title, what=what, baseline=baseline, groups=groups, caption=caption,
                         path=path)
    fig, ax, unit, med, err = _rows(timings, log=False)
    bars = ax.barh(range(len(timings)), med, xerr=err, capsize=3, error_kw={"lw": 1},
                   color=_colours(timings, baseline, groups))
    for bar, t in zip(bars, timings.values()):
        if t.repeats == 1:
            bar.set(hatch="//", facecolor="white", edgecolor=bar.get_facecolor())
    scale = UNITS[unit]
    right = max(t.max for t in timings.values()) / scale
    _notes(ax, timings, baseline, [t.max / scale + right * 0.02 for t in timings.values()])
    ax.set_xlim(0, right * 1.3)
    ax.set_xlabel(f"{what} ({unit})", fontsize=9)
    _legend(ax, timings, baseline, None, groups)
    return _save_if(_finish(fig, ax, title, caption), path)


def line_plot(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, xlabel: str,
              ylabel: str, logx: bool = False, logy: bool = False, hlines: Mapping[str, float] | None = None,
              caption: str | None = None, path: str | Path | None = None) -> Figure:
    """One line per series over a shared ``x``, each its own colour; ``hlines`` draws labelled reference lines.

    The y-axis starts at zero unless ``logy``, so the heights of two lines compare as sizes.
    """
    ncols = 2 if len(series) == 4 else min(len(series), 3)
    rows = -(-len(series) // ncols) if series else 0
    fig, ax = plt.subplots(figsize=(8, 4.6 + 0.22 * rows))
    colours = plt.get_cmap("tab10" if len(series) <= 10 else "tab20").colors
    for i, (label, y) in enumerate(series.items()):
        ax.plot(x, y, marker=MARKERS[i % len(MARKERS)], color=colours[i % len(colours)], label=label)
    lowest = min(hlines.values()) if hlines and len(hlines) > 1 else None
    for label, level in (hlines or {}).items():
        ax.axhline(level, ls="--", lw=1, color="0.45")
        # Labels sit above their lines, the lowest one below its own: two close lines keep readable labels.
        ax.annotate(label, (0.01, level), xycoords=("axes fraction", "data"), fontsize=8,
                    va="top" if level == lowest else "bottom",
                    color="0.3", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
                    zorder=1.5)  # above the grid, below the data lines (zorder 2)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    if not logy:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if series:  # below the axes, where it never hides a line
        ax.legend(fontsize=8, ncols=ncols, frameon=False, loc="upper center",
                  bbox_to_anchor=(0.5, -0.1 - 0.35 / fig.get_figheight()))
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
