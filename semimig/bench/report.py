"""Turn benchmark records into the table, JSON and PNG plots (RT and ACC as in the paper's Figs. 9-11).

The rows it prints and plots come from :func:`semimig.bench.results.summarize` (re-exported here): the
results module owns the records and their summaries; this module only reads them (nothing below imports it).
"""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Sequence

from semimig.bench.results import RUN_ONLY_KEYS, SWEEP_KEYS, summarize  # noqa: F401  (summarize: re-exported)
from semimig.bench.results import acc_delta as _acc_delta  # noqa: F401  (the old private name)
from semimig.errors import ConfigError
from semimig.resizing.config import ResizingConfig


def _accuracy_cells(row: dict) -> tuple[str, str]:
    if row["accuracy_mean"] is None:
        return "-", "-"
    acc = f"{100 * row['accuracy_mean']:.1f} ± {100 * row['accuracy_std']:.1f}"
    delta = row["acc_delta_vs_baseline"]
    if delta is None:
        return acc, "-"
    text = f"{100 * delta:+.1f}"
    if row["acc_delta_std"] is not None:
        text += f" ± {100 * row['acc_delta_std']:.1f}" + (" (noise)" if row["acc_delta_within_noise"] else "")
    return acc, text


WIDTH = 80
"""The 1-D table, its title and its notes fit a terminal or a pipe this wide (headers never cut)."""
COLUMNS = ("mode", "chi", "epoch s", "vs chi 1", "speed-up", "ACC %", "ACC - base")
LEGEND = ("epoch s: seconds per epoch (the paper's RT), mean over seeds; vs chi 1: iteration time over the same "
          "mode's healthy (chi 1) run; speed-up: baseline's (Colossal-AI alone) iteration time over the mode's, "
          "at the same chi; ACC: test accuracy (%) after training, mean ± std over seeds; ACC - base: its paired "
          "difference to baseline, same seeds and chi (points; same: every seed equal), * where within the spread "
          "over seeds: neither a gain nor a loss")


def _cells(row: dict, baseline_iter_s: dict) -> list[str]:
    """One row of the 1-D table (:data:`COLUMNS`), each cell short enough for :data:`WIDTH`."""
    base = baseline_iter_s.get(row["chi"])
    speedup = "-" if not base or row["mode"] == "baseline" else f"{base / row['iter_time_s']:.2f}x"
    acc = delta = "-"
    if row.get("accuracy_mean") is not None:
        acc = f"{100 * row['accuracy_mean']:.1f}±{100 * (row.get('accuracy_std') or 0.0):.1f}"
    d = row.get("acc_delta_vs_baseline")
    if d is not None and row["mode"] != "baseline" and d == 0.0 and not row.get("acc_delta_std"):
        delta = "same"
    elif d is not None and row["mode"] != "baseline":
        delta = f"{100 * d:+.1f}"
        if row.get("acc_delta_std") is not None:
            delta += f"±{100 * row['acc_delta_std']:.1f}" + ("*" if row.get("acc_delta_within_noise") else "")
    rt = row.get("rt_vs_chi1")
    return [row["label"], f"{row['chi']:g}", f"{row['epoch_time_s']:.2f}", "-" if rt is None else f"{rt:.2f}x",
            speedup, acc, delta]


def _display_order(rows: Sequence[dict]) -> list[dict]:
    """Rows by chi (healthy first), Colossal-AI alone first at each chi, then the modes by name and λ."""
    return sorted(rows, key=lambda r: (r["chi"], r["mode"] != "baseline", r["mode"],
                                       -1 if r.get("lambda") is None else r["lambda"]))


def print_table(rows: Sequence[dict], title: str, *, console=None) -> None:
    """The 1-D table under ``title`` (lines wrapped to :data:`WIDTH`), its legend and what it shows in words
    (:func:`takeaways`); ``console``: a :class:`rich.console.Console` (default: stdout's)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    say = (lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True))
    for line in title.splitlines():
        say(_wrap(line))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True, min_width=len(col))
    baseline_iter_s = {row["chi"]: row["iter_time_s"] for row in rows
                       if row["mode"] == "baseline" and row.get("lambda") is None}
    for row in _display_order(rows):
        table.add_row(*_cells(row, baseline_iter_s))
    console.print(table)
    say(_wrap(LEGEND))
    for line in takeaways(rows):
        say(_wrap(line))
    if any(row["accuracy_mean"] is None for row in rows):
        say(_wrap("accuracy not measured (time-only run: too few iterations for accuracy to differ from chance)"))
    elif any(row["acc_delta_vs_baseline"] is not None and row["acc_delta_std"] is None for row in rows):
        say(_wrap("ACC - base from one seed has no noise estimate: run several seeds before reading it as a gain "
                  "or a loss"))


def takeaways(rows: Sequence[dict]) -> list[str]:
    """At each chi > 1, every mode's speed-up against Colossal-AI alone and what it did to accuracy."""
    lines = []
    plain = [row for row in rows if row.get("lambda") is None]
    for chi in sorted({row["chi"] for row in plain if row["chi"] > 1.0}):
        base = next((row for row in plain if row["chi"] == chi and row["mode"] == "baseline"), None)
        others = [row for row in _display_order(plain) if row["chi"] == chi and row["mode"] != "baseline"]
        if base is None or not others:
            continue
        parts = [f"{row['label']} {base['iter_time_s'] / row['iter_time_s']:.2f}x as fast{_accuracy_words(row)}"
                 for row in others]
        lines.append(f"at chi {chi:g}, against Colossal-AI alone: " + "; ".join(parts))
    return lines


def _accuracy_words(row: dict) -> str:
    delta, std = row.get("acc_delta_vs_baseline"), row.get("acc_delta_std")
    if delta is None:
        return ""
    if delta == 0.0 and not std:
        return ", the same accuracy"
    if row.get("acc_delta_within_noise"):
        return f", accuracy {100 * delta:+.1f} points (within the seed spread)"
    return f", accuracy {100 * delta:+.1f} points"


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, WIDTH, break_on_hyphens=False, break_long_words=False)


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": __import__("os").cpu_count(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write_json(path: Path, records: Sequence[dict], rows: Sequence[dict], config: dict, *,
               machine_info: dict | list | None = None, sources: Sequence[str] | None = None) -> None:
    """``{"records", "summary", "machine", "config"}`` (+ ``"sources"`` for a merged report), atomically."""
    from semimig import _io

    out = {"records": list(records), "summary": list(rows),
           "machine": machine() if machine_info is None else machine_info, "config": config}
    if sources is not None:
        out["sources"] = list(sources)
    _io.write_json(path, out)


# Config keys that only some modes read, with the value a run saved before the key existed used:
# runs may differ in them as long as every run holding one of those modes agrees.
MODE_SCOPED_KEYS = {"theta_iter": (("zero-pridiff-e", "zero-pridiff-r"), ResizingConfig.theta_iter)}


def load_saved(path: Path) -> dict:
    """A JSON written by ``semimig bench``, schema-checked (:mod:`semimig.bench.schema`); errors
    (:class:`~semimig.errors.ConfigError`) name the file, the key and the bad value in one line."""
    from semimig._io import check_input_file
    from semimig.bench.schema import validate_saved

    check_input_file(path, "saved run")
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not JSON: {err}") from None
    except RecursionError:
        raise ConfigError(f"{path} nests too deeply to be a semimig bench result") from None
    return validate_saved(data, str(path))


def merge_saved(saved: Sequence[tuple[str, dict]]) -> tuple[list[dict], dict, dict | list]:
    """Records, config and machine of several saved runs of the same experiment.

    The runs must agree on every config key but the sweep axes (:data:`SWEEP_KEYS`, merged as
    unions in first-seen order), and no case ``(mode, chi, seed, λ)`` may be measured twice:
    the summary then compares each mode with the baseline of the same seeds exactly as one run
    would (a run's baseline accuracy depends only on the seed).  ``machine`` is the runs'
    common machine, or the list of them when they differ.
    """
    if not saved:
        raise ConfigError("no saved runs given")
    (first_name, first), records, owner = saved[0], [], {}
    config = {**first["config"], **_mode_scoped_values(saved)}
    for name, data in saved:
        cfg = data["config"]
        for key in sorted(set(cfg) | set(first["config"])):
            if key in SWEEP_KEYS or key in MODE_SCOPED_KEYS or key in RUN_ONLY_KEYS:
                continue
            if key not in cfg or key not in first["config"]:
                where = name if key in cfg else first_name
                raise ConfigError(f"config key {key!r} is only in {where}: the runs do not compare")
            if cfg[key] != first["config"][key]:
                raise ConfigError(f"config {key!r} differs: {first['config'][key]} in {first_name} "
                                 f"but {cfg[key]} in {name}")
        for key in SWEEP_KEYS:
            config[key] = list(dict.fromkeys([*config.get(key, []), *cfg.get(key, [])]))
        for r in data["records"]:
            case = (r["mode"], r.get("chi"), r["seed"], r.get("lambda"))
            if case in owner:
                chi = "" if case[1] is None else f", chi {case[1]:g}"
                raise ConfigError(f"(mode {case[0]!r}{chi}, seed {case[2]}, lambda {case[3]}) is in "
                                  f"both {owner[case]} and {name}")
            owner[case] = name
            records.append(r)
    machines = [data.get("machine") for _, data in saved]
    machine_info = machines[0] if all(m == machines[0] for m in machines) else machines
    return records, config, machine_info


def _mode_scoped_values(saved: Sequence[tuple[str, dict]]) -> dict:
    """The one value of each :data:`MODE_SCOPED_KEYS` key among the runs that hold its modes."""
    values = {}
    for key, (modes, default) in MODE_SCOPED_KEYS.items():
        seen: dict = {}
        for name, data in saved:
            if any(r["mode"] in modes for r in data["records"]):
                seen.setdefault(data["config"].get(key, default), name)
        if len(seen) > 1:
            (a, first), (b, second) = list(seen.items())[:2]
            raise ConfigError(f"config {key!r} differs between runs of {', '.join(modes)}: {a} in {first} "
                             f"but {b} in {second}")
        values[key] = next(iter(seen), saved[0][1]["config"].get(key, default))
    return values


def write_plots(directory: Path, rows: Sequence[dict], title: str) -> list[Path]:
    """``rt_vs_chi.png`` and, where seeds give a noise estimate, ``acc_delta.png`` in ``directory``
    (plus ``lambda_sweep.png`` when the rows hold a λ sweep); returns the paths.

    The epoch time is the mean over the seeds with their min–max as an error bar.  An accuracy
    delta is drawn with its spread over seeds as an error bar, and hollow and grey when it is
    within that spread (not a gain, not a loss); deltas from one seed are not drawn at all.  Every
    title's second line says how many seeds a point averages (:func:`seeds_note`); the first comes
    from the caller and says whether the compute was measured or emulated.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    title = f"{title}\n{seeds_note(rows)}"
    plain = [row for row in rows if row.get("lambda") is None]
    paths = [_plot_times(plt, directory / "rt_vs_chi.png", plain, title)]
    if any(row.get("acc_delta_std") is not None for row in plain):
        paths.append(_plot_acc_delta(plt, directory / "acc_delta.png", plain, title))
    if any(row.get("lambda") is not None for row in rows):
        paths.append(_plot_lambda_sweep(plt, directory / "lambda_sweep.png", rows, title))
    return paths


def seeds_note(rows: Sequence[dict]) -> str:
    """How many seeds each plotted point averages (the figures' second title line)."""
    counts = sorted({int(row.get("seeds", 1)) for row in rows}) or [1]
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    bars = "; bars: spread over seeds" if counts[-1] > 1 else ""
    return f"{n} seed{'' if counts[-1] == 1 else 's'} per point{bars}"


def _save(plt, fig, path: Path) -> Path:
    from semimig._io import write_figure

    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def _plot_times(plt, path: Path, rows: Sequence[dict], title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in sorted({row["mode"] for row in rows}):
        pts = sorted(((row["chi"], row["epoch_time_s"], row.get("epoch_time_range")) for row in rows
                      if row["mode"] == mode), key=lambda p: p[0])
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if any(p[2] for p in pts):  # min–max over the seeds, around the mean
            err = [[y - (r or (y, y))[0] for _, y, r in pts], [(r or (y, y))[1] - y for _, y, r in pts]]
            ax.errorbar(xs, ys, yerr=err, capsize=3, marker="o", label=mode)
        else:
            ax.plot(xs, ys, marker="o", label=mode)
    ax.set(xlabel="straggler slowdown chi", ylabel="epoch time RT (s), mean over seeds")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _draw_deltas(ax, points: Sequence[tuple[float, dict]], **line) -> None:
    """Accuracy deltas at x with error bars (seed spread); within the spread: hollow, grey."""
    points = [(x, row) for x, row in points if row.get("acc_delta_std") is not None]
    if not points:
        return
    xs = [x for x, _ in points]
    ys = [100 * row["acc_delta_vs_baseline"] for _, row in points]
    errs = [100 * row["acc_delta_std"] for _, row in points]
    ax.errorbar(xs, ys, yerr=errs, capsize=3, **{"marker": "o", **line})
    noise = [(x, y) for (x, row), y in zip(points, ys) if row["acc_delta_within_noise"]]
    if noise:
        ax.plot(*zip(*noise), marker="o", linestyle="none", markersize=8, markerfacecolor="white",
                markeredgecolor="grey", zorder=3)


def _plot_acc_delta(plt, path: Path, rows: Sequence[dict], title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in sorted({row["mode"] for row in rows} - {"baseline"}):
        _draw_deltas(ax, sorted(((row["chi"], row) for row in rows if row["mode"] == mode), key=lambda p: p[0]),
                     label=mode)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set(xlabel="straggler slowdown chi", ylabel="accuracy - baseline (points)")
    ax.set_title(title + "; hollow grey: within the spread (no difference)", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _plot_lambda_sweep(plt, path: Path, rows: Sequence[dict], title: str) -> Path:
    """Paper Fig. 11: RT and ACC delta vs λ (migrating stragglers), one line per chi; a star marks
    plain ``semi`` (Eq. 3's own x) at its x.  Accuracy as in :func:`write_plots` (bars, noise grey)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    chis = sorted({row["chi"] for row in rows if row.get("lambda") is not None})
    for chi in chis:
        sweep = sorted(((row["lambda"], row) for row in rows if row.get("lambda") is not None and row["chi"] == chi),
                       key=lambda p: p[0])
        auto = [row for row in rows if row["mode"] == "semi" and row.get("lambda") is None and row["chi"] == chi]
        base = [row for row in rows if row["mode"] == "baseline" and row["chi"] == chi]
        line, = axes[0].plot(*zip(*[(lam, row["epoch_time_s"]) for lam, row in sweep]), marker="o",
                             label=f"chi={chi:g}")
        color = line.get_color()
        for row in base:
            axes[0].axhline(row["epoch_time_s"], color=color, linestyle="--", linewidth=1,
                            label=f"baseline, chi={chi:g}")
        _draw_deltas(axes[1], sweep, color=color, label=f"chi={chi:g}")
        for row in auto:
            axes[0].plot([row["migrating_stragglers"]], [row["epoch_time_s"]], marker="*", markersize=14,
                         color=color, linestyle="none", label=f"Eq. 3 choice, chi={chi:g}")
            _draw_deltas(axes[1], [(row["migrating_stragglers"], row)], color=color, marker="*", markersize=14,
                         linestyle="none")
    for ax, ylabel in ((axes[0], "epoch time RT (s)"), (axes[1], "accuracy - baseline (points)")):
        ax.set_xlabel("stragglers that migrate (λ); the others resize")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title + " (accuracy: hollow grey = within the spread)", fontsize=9)
    return _save(plt, fig, path)
