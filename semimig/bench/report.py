"""Turn benchmark records into the table, JSON and PNG plots (RT and ACC as in the paper's Figs. 9-11)."""
from __future__ import annotations

import json
import platform
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from semimig.resizing.config import ResizingConfig


def summarize(records: Sequence[dict]) -> list[dict]:
    """Per (mode, λ, chi): mean epoch/iteration time, accuracy mean ± std over seeds, RT vs chi = 1.

    ``label`` names the row (``semi λ=2`` for a λ-sweep run); a λ row's RT is relative to plain
    ``semi`` at chi = 1 (with no straggler there is nothing to sweep).
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["mode"], r.get("lambda"), r["chi"])].append(r)
    rows = []
    for (mode, lam, chi), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1], kv[0][2])):
        acc = [r["accuracy"] for r in rs]
        rows.append({
            "mode": mode, "lambda": lam, "label": mode if lam is None else f"{mode} λ={lam}",
            "chi": chi, "seeds": len(rs),
            "iter_time_s": statistics.mean(r["iter_time_s"] for r in rs),
            "epoch_time_s": statistics.mean(r["epoch_time_s"] for r in rs),
            "accuracy_mean": statistics.mean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "migrating_stragglers": statistics.mean(r.get("migrating_stragglers", 0) for r in rs),
        })
    base_time = {row["mode"]: row["iter_time_s"] for row in rows if row["chi"] == 1.0 and row["lambda"] is None}
    base_acc = {row["chi"]: row["accuracy_mean"] for row in rows if row["mode"] == "baseline"}
    for row in rows:
        ref = base_time.get(row["mode"])
        row["rt_vs_chi1"] = row["iter_time_s"] / ref if ref else None
        row["acc_delta_vs_baseline"] = (row["accuracy_mean"] - base_acc[row["chi"]]) if row["chi"] in base_acc else None
    return rows


def print_table(rows: Sequence[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("mode", "chi", "iter s", "epoch s (RT)", "RT / RT(chi=1)", "ACC mean ± std", "ACC - baseline"):
        table.add_column(col, justify="right", no_wrap=(col == "mode"))
    for row in rows:
        table.add_row(
            row["label"], f"{row['chi']:g}", f"{row['iter_time_s']:.3f}", f"{row['epoch_time_s']:.2f}",
            "-" if row["rt_vs_chi1"] is None else f"{row['rt_vs_chi1']:.2f}x",
            f"{100 * row['accuracy_mean']:.1f} ± {100 * row['accuracy_std']:.1f}",
            "-" if row["acc_delta_vs_baseline"] is None else f"{100 * row['acc_delta_vs_baseline']:+.1f}",
        )
    Console().print(table)


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": __import__("os").cpu_count(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write_json(path: Path, records: Sequence[dict], rows: Sequence[dict], config: dict, *,
               machine_info: dict | list | None = None, sources: Sequence[str] | None = None) -> None:
    """``{"records", "summary", "machine", "config"}`` (+ ``"sources"`` for a merged report)."""
    out = {"records": list(records), "summary": list(rows),
           "machine": machine() if machine_info is None else machine_info, "config": config}
    if sources is not None:
        out["sources"] = list(sources)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))


# Config keys along which saved runs may differ and still be compared: the sweep axes.
SWEEP_KEYS = ("modes", "chis", "seeds", "lambdas")

# Config keys that only some modes read, with the value a run saved before the key existed used:
# runs may differ in them as long as every run holding one of those modes agrees.
MODE_SCOPED_KEYS = {"theta_iter": (("zero-pridiff-e", "zero-pridiff-r"), ResizingConfig.theta_iter)}


def load_saved(path: Path) -> dict:
    """A JSON written by ``semimig bench`` (``records`` and ``config``); errors name the file."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON: {err}") from err
    for key in ("records", "config"):
        if not isinstance(data, dict) or key not in data:
            raise ValueError(f"{path} has no {key!r}: not a JSON written by semimig bench")
    return data


def merge_saved(saved: Sequence[tuple[str, dict]]) -> tuple[list[dict], dict, dict | list]:
    """Records, config and machine of several saved runs of the same experiment.

    The runs must agree on every config key but the sweep axes (:data:`SWEEP_KEYS`, merged as
    unions in first-seen order), and no case ``(mode, chi, seed, λ)`` may be measured twice:
    the summary then compares each mode with the baseline of the same seeds exactly as one run
    would (a run's baseline accuracy depends only on the seed).  ``machine`` is the runs'
    common machine, or the list of them when they differ.
    """
    if not saved:
        raise ValueError("no saved runs given")
    (first_name, first), records, owner = saved[0], [], {}
    config = {**first["config"], **_mode_scoped_values(saved)}
    for name, data in saved:
        cfg = data["config"]
        for key in sorted(set(cfg) | set(first["config"])):
            if key in SWEEP_KEYS or key in MODE_SCOPED_KEYS:
                continue
            if key not in cfg or key not in first["config"]:
                where = name if key in cfg else first_name
                raise ValueError(f"config key {key!r} is only in {where}: the runs do not compare")
            if cfg[key] != first["config"][key]:
                raise ValueError(f"config {key!r} differs: {first['config'][key]} in {first_name} "
                                 f"but {cfg[key]} in {name}")
        for key in SWEEP_KEYS:
            config[key] = list(dict.fromkeys([*config.get(key, []), *cfg.get(key, [])]))
        for r in data["records"]:
            case = (r["mode"], r["chi"], r["seed"], r.get("lambda"))
            if case in owner:
                raise ValueError(f"(mode {case[0]!r}, chi {case[1]:g}, seed {case[2]}, lambda {case[3]}) is in "
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
            raise ValueError(f"config {key!r} differs between runs of {', '.join(modes)}: {a} in {first} "
                             f"but {b} in {second}")
        values[key] = next(iter(seen), saved[0][1]["config"].get(key, default))
    return values


def write_plots(directory: Path, rows: Sequence[dict], title: str) -> list[Path]:
    """``rt_vs_chi.png`` and ``acc_delta.png`` in ``directory`` (plus ``lambda_sweep.png`` when
    the rows hold a λ sweep); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    plain = [row for row in rows if row.get("lambda") is None]
    modes = sorted({row["mode"] for row in plain})
    paths = []
    for key, ylabel, name in (("epoch_time_s", "epoch time RT (s)", "rt_vs_chi.png"),
                              ("acc_delta_vs_baseline", "accuracy - baseline (points)", "acc_delta.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in modes:
            pts = [(row["chi"], row[key]) for row in plain if row["mode"] == mode and row[key] is not None]
            if pts:
                xs, ys = zip(*sorted(pts))
                scale = 100.0 if key == "acc_delta_vs_baseline" else 1.0
                ax.plot(xs, [y * scale for y in ys], marker="o", label=mode)
        ax.set_xlabel("straggler slowdown chi")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    if any(row.get("lambda") is not None for row in rows):
        paths.append(_plot_lambda_sweep(plt, directory / "lambda_sweep.png", rows, title))
    return paths


def _plot_lambda_sweep(plt, path: Path, rows: Sequence[dict], title: str) -> Path:
    """Paper Fig. 11: RT and ACC delta vs λ (migrating stragglers), one line per chi; a star marks
    plain ``semi`` (Eq. 3's own x) at its x."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    chis = sorted({row["chi"] for row in rows if row.get("lambda") is not None})
    for chi in chis:
        sweep = sorted((row["lambda"], row) for row in rows if row.get("lambda") is not None and row["chi"] == chi)
        auto = [row for row in rows if row["mode"] == "semi" and row.get("lambda") is None and row["chi"] == chi]
        base = [row for row in rows if row["mode"] == "baseline" and row["chi"] == chi]
        for ax, key, scale in ((axes[0], "epoch_time_s", 1.0), (axes[1], "acc_delta_vs_baseline", 100.0)):
            pts = [(lam, row[key] * scale) for lam, row in sweep if row[key] is not None]
            if pts:
                line, = ax.plot(*zip(*pts), marker="o", label=f"chi={chi:g}")
                if key == "epoch_time_s":
                    for row in base:
                        ax.axhline(row[key], color=line.get_color(), linestyle="--", linewidth=1,
                                   label=f"baseline, chi={chi:g}")
                for row in auto:
                    if row[key] is not None:
                        ax.plot([row["migrating_stragglers"]], [row[key] * scale], marker="*", markersize=14,
                                color=line.get_color(), linestyle="none", label=f"Eq. 3 choice, chi={chi:g}")
    for ax, ylabel in ((axes[0], "epoch time RT (s)"), (axes[1], "accuracy - baseline (points)")):
        ax.set_xlabel("stragglers that migrate (λ); the others resize")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
