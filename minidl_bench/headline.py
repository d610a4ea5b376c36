"""Notebook 10's headline comparisons, this run beside the reference run: one figure and its verdicts.

Each comparison is a list of per-round ratios (minidl over torch, or process workers over thread workers) from
``python -m minidl_bench loaders overhead``'s rounds; ``show`` draws them as bars from zero with whiskers from
the fastest to the slowest round and returns one verdict line per comparison (``live.verdict``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from minidl_bench import live, plot

PANELS = {  # panel title -> the comparisons it shows
    "throughput, minidl / torch\n(above 1: minidl faster)": ("numpy, 0 workers", "numpy, 2 workers"),
    "own cost per batch, no workers,\nminidl / torch (below 1: minidl cheaper)": ("batch size 1", "batch size 64"),
    "first batch of a trivial dataset,\nprocesses / threads (above 1: threads sooner)": ("2 workers",),
}
WORDS = {  # comparison -> what a ratio above 1 and below 1 mean
    "numpy, 0 workers": ("minidl faster", "minidl slower"), "numpy, 2 workers": ("minidl faster", "minidl slower"),
    "batch size 1": ("minidl dearer", "minidl cheaper"), "batch size 64": ("minidl dearer", "minidl cheaper"),
    "2 workers": ("threads sooner", "processes sooner"),
}


def show(runs: Mapping[str, Mapping[str, Sequence[float]]], caption: str) -> list[str]:
    """Draw each run's per-round ratios per comparison (``runs``: run label -> comparison -> ratios), side by
    side in three panels; return, per comparison, each run's spread and the first run's verdict."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), width_ratios=(2, 2, 1))
    for ax, (title, names) in zip(axes, PANELS.items()):
        for j, (who, ratios) in enumerate(runs.items()):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(names))]
            med = [statistics.median(ratios[n]) for n in names]
            err = [[m - min(ratios[n]) for m, n in zip(med, names)], [max(ratios[n]) - m for m, n in zip(med, names)]]
            bars = ax.bar(xs, med, 0.36, yerr=err, capsize=3, color=plot.GROUP_COLOURS[j], label=who)
            ax.bar_label(bars, [f"x{m:.2f}" for m in med], fontsize=8, padding=2)
        ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
        ax.set(xticks=range(len(names)), xticklabels=names, title=title, ylim=(0, ax.get_ylim()[1] * 1.12))
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("median of per-round ratios\n(whiskers: fastest to slowest round)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("The headline comparisons: this run beside the reference run")
    fig.text(0.01, 0.005, caption, fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    plt.show()

    (this, here), *others = runs.items()
    lines = []
    for name, (more, less) in WORDS.items():
        lines.append(f"{name:14s} {this} {live.spread(here[name])}: {live.verdict(here[name], more, less)}")
        lines += [f"{'':14s} {who} {live.spread(ratios[name])}" for who, ratios in others]
    return lines
