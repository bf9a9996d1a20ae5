"""The 2-D benchmark's summary, table and plot (``semimig bench --allocation ...``).

One row per mode (``baseline``, ``poplar``, ``semi``, ``poplar+semi``) over the seeds: iteration and
epoch time, the speed-up against ``baseline`` (baseline's iteration time / the mode's), the DP
groups' batch shares (first plan and last, after re-plans), and accuracy with its paired
difference to the baseline (same seeds; within the seed spread it is marked as noise, as in
:func:`semimig.bench.results.summarize`); the rows come from :func:`semimig.bench.results.summarize_grid`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from semimig.bench.report import _accuracy_cells
from semimig.bench.results import MODE_ORDER  # noqa: F401  (re-exported)
from semimig.bench.results import summarize_grid as summarize  # noqa: F401  (re-exported: the rows of a 2-D run)


def ratios(rows: Sequence[dict]) -> list[str]:
    """The issue's comparison: ``poplar+semi`` against each of the other modes (iteration time)."""
    by = {row["mode"]: row for row in rows}
    both = by.get("poplar+semi")
    if both is None:
        return []
    return [f"poplar+semi is {by[m]['iter_time_s'] / both['iter_time_s']:.2f}x as fast as {m}"
            for m in ("baseline", "poplar", "semi") if m in by]


def print_table(rows: Sequence[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table


    table = Table(title=title)
    for col in ("mode", "iter s", "epoch s", "speed-up", "samples/group", "re-plans", "ACC", "ACC - base"):
        table.add_column(col, justify="right", no_wrap=(col == "mode"))
    for row in rows:
        first, last = ("/".join(str(n) for n in row[k] or ()) for k in ("group_samples_first", "group_samples"))
        samples = first if first == last else f"{first} -> {last}"
        table.add_row(row["mode"], f"{row['iter_time_s']:.3f}", f"{row['epoch_time_s']:.2f}",
                      "-" if row["speedup_vs_baseline"] is None else f"{row['speedup_vs_baseline']:.2f}x",
                      samples, f"{row['replans']:g}", *_accuracy_cells(row))
    Console().print(table)
    print("speed-up: baseline's iteration time / the mode's; samples/group: the batch plan (first -> after re-plans)")
    for line in ratios(rows):
        print(line)


def write_plot(directory: Path, rows: Sequence[dict], title: str) -> Path:
    """``grid_modes.png``: iteration time per mode (bars; spread over seeds as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [row["mode"] for row in rows]
    times = [row["iter_time_s"] for row in rows]
    errors = [row["iter_time_std"] or 0.0 for row in rows]
    bars = ax.bar(names, times, yerr=errors, capsize=4, color="tab:blue")
    for bar, row in zip(bars, rows):
        if row["speedup_vs_baseline"] is not None:
            ax.annotate(f"{row['speedup_vs_baseline']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("iteration time (s)")
    ax.set_title(title + "\nlabels: speed-up against baseline", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = directory / "grid_modes.png"
    from semimig._io import write_figure

    write_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def show(records: Sequence[dict], title: str, plots: Optional[Path]) -> None:
    """Table, ratios and (unless ``plots`` is None) the plot of 2-D records."""
    rows = summarize(records)
    print_table(rows, title)
    if any(row["accuracy_mean"] is None for row in rows):
        print("accuracy not measured (time-only run)")
    if plots is not None:
        print(f"plot: {write_plot(plots, rows, title)}")
