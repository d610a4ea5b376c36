"""Notebook 09's last figures, from the committed ``threads`` suite (``results/threads/``): start-up and memory.

One function draws both and returns, in words, the figures the chapter's prose reads from them, so the
notebook's cell is one call.
It lives beside ``threads_report`` (it reads the same merged CSV), not in ``minidl_course``, which may not import
``minidl_bench``.
"""

from __future__ import annotations

from collections.abc import Sequence

from minidl_bench import threads_report
from minidl_bench.threads_report import Row

COLOURS = {"GIL": "tab:blue", "free-threaded": "tab:red"}  # one colour per build
STYLES = {"thread": ("o", "--"), "process": ("s", "-")}  # threads dashed with circles, processes solid with squares


def _first_ms(keyed, build: str, name: str, backend: str, workers: int, stat: str = "median") -> float:
    return float(keyed[build, name, backend, workers][f"first_batch_s_{stat}"]) * 1e3


def _pss(keyed, build: str, name: str, backend: str, workers: int) -> float:
    return float(keyed[build, name, "serial" if workers == 0 else backend, workers]["peak_pss_mib_median"])


def startup_and_memory(rows: Sequence[Row], run_label: str) -> list[str]:
    """Draw the time to the first batch (per workload) and the peak PSS (numpy, images) of the committed run,
    per build and backend; return the lines the prose reads: PSS per worker count, first batches, PSS added."""
    import matplotlib.pyplot as plt

    keyed = threads_report.by_key(rows)
    names = list(dict.fromkeys(k[1] for k in keyed))
    counts = sorted({k[3] for k in keyed})
    builds = sorted({k[0] for k in keyed})
    cores = int(rows[0]["cores"])
    caption = f"{run_label}: {threads_report.caption(rows)}"

    fig, ax = plt.subplots(figsize=(8, 4.4))
    looks = [(build, backend) for build in builds for backend in threads_report.BACKENDS]
    for j, (build, backend) in enumerate(looks):
        median, low, high = ([_first_ms(keyed, build, n, backend, cores, s) for n in names]
                             for s in ("median", "min", "max"))
        ax.errorbar([i + (j - (len(looks) - 1) / 2) * 0.16 for i in range(len(names))], median, capsize=3,
                    fmt=STYLES[backend][0], color=COLOURS.get(build, "black"),
                    yerr=[[m - lo for m, lo in zip(median, low)], [hi - m for m, hi in zip(median, high)]],
                    label=f"{build} build, {cores} {threads_report.LABELS[backend]}")
    ax.set(xticks=range(len(names)), xticklabels=names, yscale="log",
           ylabel="time to first batch (ms, log scale)\ndot: median, whiskers: min to max",
           title=f"Time to the first batch with {cores} workers (worker start + one batch)")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, caption, fontsize=7)
    plt.show()

    # Two panels, one per workload: four lines each, threads dashed over processes solid, so lines that
    # coincide still show both (the threads of the two builds come out within a few MiB of each other).
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, name in zip(axes, ("numpy", "images")):
        for build in builds:
            for backend in ("process", "thread"):
                marker, line = STYLES[backend]
                ax.plot(counts, [_pss(keyed, build, name, backend, c) for c in counts], marker=marker, linestyle=line,
                        color=COLOURS.get(build, "black"), label=f"{build} build, {threads_report.LABELS[backend]}")
        ax.set(title=f"{name} workload", xlabel="num_workers", xticks=counts, ylim=(0, None))
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("peak PSS, main + workers (MiB)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("Peak memory of the loading processes (PSS summed)", fontsize=10)
    fig.text(0.01, 0.005, caption, fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    plt.show()

    lines = []
    for name in ("numpy", "images"):
        for build in builds:
            pss = [_pss(keyed, build, name, "process", c) for c in counts]
            rises = all(x < y for x, y in zip(pss, pss[1:]))
            lines.append(f"{name} · {build} · processes, PSS MiB at {counts} workers: "
                         f"{', '.join(f'{x:.0f}' for x in pss)} "
                         f"({'up at every step' if rises else 'not up at every step'})"
                         f"; threads at {counts[-1]}: {_pss(keyed, build, name, 'thread', counts[-1]):.0f}")
    first = {(b, n, k): _first_ms(keyed, b, n, k, cores) for b in builds for n in ("numpy", "python")
             for k in threads_report.BACKENDS}
    lines.append(f"numpy, first batch with {cores} workers: a process worker's took "
                 + ", ".join(f"x{first[b, 'numpy', 'process'] / first[b, 'numpy', 'thread']:.1f} a thread's ({b})"
                             for b in builds))
    lines.append(f"python, first batch with {cores} workers: " + "; ".join(
        f"{b} build {cores} threads {first[b, 'python', 'thread']:.0f} ms, {cores} processes "
        f"{first[b, 'python', 'process']:.0f} ms" for b in builds))
    for name in ("numpy", "images"):
        added = {(b, k): _pss(keyed, b, name, k, counts[-1]) - _pss(keyed, b, name, k, 0)
                 for b in builds for k in threads_report.BACKENDS}
        lines.append(f"{name}, PSS added by {counts[-1]} workers: " + "; ".join(
            f"{b} build {added[b, 'process']:+.0f} MiB with processes, {added[b, 'thread']:+.0f} MiB with threads"
            for b in builds))
    return lines
