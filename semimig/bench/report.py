"""Turn benchmark records into the table, JSON and PNG plots (RT and ACC as in the paper's Figs. 9-11)."""
from __future__ import annotations

import json
import platform
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence


def summarize(records: Sequence[dict]) -> list[dict]:
    """Per (mode, chi): mean epoch/iteration time, accuracy mean ± std over seeds, RT vs chi = 1."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["mode"], r["chi"])].append(r)
    rows = []
    for (mode, chi), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        acc = [r["accuracy"] for r in rs]
        rows.append({
            "mode": mode, "chi": chi, "seeds": len(rs),
            "iter_time_s": statistics.mean(r["iter_time_s"] for r in rs),
            "epoch_time_s": statistics.mean(r["epoch_time_s"] for r in rs),
            "accuracy_mean": statistics.mean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
        })
    base_time = {row["mode"]: row["iter_time_s"] for row in rows if row["chi"] == 1.0}
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
            row["mode"], f"{row['chi']:g}", f"{row['iter_time_s']:.3f}", f"{row['epoch_time_s']:.2f}",
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


def write_json(path: Path, records: Sequence[dict], rows: Sequence[dict], config: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": list(records), "summary": list(rows), "machine": machine(),
                                "config": config}, indent=2, default=str))


def write_plots(directory: Path, rows: Sequence[dict], title: str) -> list[Path]:
    """``rt_vs_chi.png`` and ``acc_delta.png`` in ``directory``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    modes = sorted({row["mode"] for row in rows})
    paths = []
    for key, ylabel, name in (("epoch_time_s", "epoch time RT (s)", "rt_vs_chi.png"),
                              ("acc_delta_vs_baseline", "accuracy - baseline (points)", "acc_delta.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode in modes:
            pts = [(row["chi"], row[key]) for row in rows if row["mode"] == mode and row[key] is not None]
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
    return paths
