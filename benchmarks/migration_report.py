"""The report of ``benchmarks/migration_bench.py``: SG/BR ratios beside the paper's Table I, the target, tables.

Pure functions of the records the ranks return (no torch), so a saved JSON can be re-read:
``ratios`` divides scatter-gather's median iteration time by broadcast-reduce's per
``(nu, gamma)``; ``target`` checks broadcast-reduce wins at every ``gamma > 0`` with one
migrating rank (the paper: 963 / 500 = 1.93x at ``gamma = 1``).
"""
from __future__ import annotations

POLICIES = ("broadcast-reduce", "scatter-gather")
GAMMAS = (0.0, 0.25, 0.5, 0.75, 1.0)
# Paper Table I: seconds per epoch, gammas 0 .. 1, nu = 1 and nu = 4.
PAPER_TABLE = {
    ("broadcast-reduce", 1): (373, 425, 451, 473, 500),
    ("scatter-gather", 1): (373, 478, 627, 796, 963),
    ("broadcast-reduce", 4): (373, 737, 846, 998, 1113),
    ("scatter-gather", 4): (373, 779, 971, 1198, 1436),
}


def paper_ratio(nu: int, gamma: float) -> float | None:
    """The paper's SG/BR epoch-time ratio at ``(nu, gamma)``; ``None`` where Table I has no such column."""
    if ("broadcast-reduce", nu) not in PAPER_TABLE or gamma not in GAMMAS:
        return None
    i = GAMMAS.index(gamma)
    return PAPER_TABLE["scatter-gather", nu][i] / PAPER_TABLE["broadcast-reduce", nu][i]


def ratios(records: list[dict]) -> list[dict]:
    """SG/BR median-time ratio per (nu, gamma), with the paper's where it reports that nu."""
    by = {(r["policy"], r["nu"], r["gamma"]): r["iter_time_s"] for r in records}
    out = []
    for nu, gamma in sorted({(r["nu"], r["gamma"]) for r in records}):
        if ("broadcast-reduce", nu, gamma) in by and ("scatter-gather", nu, gamma) in by:
            entry = {"nu": nu, "gamma": gamma,
                     "sg_over_br": by["scatter-gather", nu, gamma] / by["broadcast-reduce", nu, gamma]}
            paper = paper_ratio(nu, gamma)
            if paper is not None:
                entry["paper_sg_over_br"] = paper
            out.append(entry)
    return out


def target(records: list[dict]) -> dict:
    """The target: broadcast-reduce faster than scatter-gather at every gamma > 0 for nu = 1."""
    rows = [r for r in ratios(records) if r["nu"] == 1 and r["gamma"] > 0]
    failing = [r["gamma"] for r in rows if r["sg_over_br"] <= 1.0]
    at_one = [r["sg_over_br"] for r in rows if r["gamma"] == 1.0]
    return {"nu": 1, "checked_gammas": [r["gamma"] for r in rows], "holds": bool(rows) and not failing,
            "failing_gammas": failing, "sg_over_br_at_gamma_1": at_one[0] if at_one else None,
            "paper_sg_over_br_at_gamma_1": paper_ratio(1, 1.0)}


def format_table(records: list[dict], cfg) -> str:
    """The paper's Table I layout in ms, SG/BR rows (ours, then the paper's) and the target verdict.

    ``cfg`` is the run's ``migration_bench.BenchConfig`` (read for the header only).
    """
    gammas = sorted({r["gamma"] for r in records})
    nus = sorted({r["nu"] for r in records})
    by = {(r["policy"], r["nu"], r["gamma"]): r["iter_time_s"] for r in records}
    ratio = {(r["nu"], r["gamma"]): r["sg_over_br"] for r in ratios(records)}
    row = "{:<22}".format
    lines = [f"Table I on CPU/gloo: median iteration time (ms) over {records[0]['iterations']} iterations; "
             f"e={cfg.world}, H={cfg.hidden}, tokens={cfg.tokens}, blocks={cfg.blocks}, "
             f"emulated device {cfg.device_ms:g} ms/iteration",
             row("policy(nu) / gamma") + "".join(f"{g:>9.2f}" for g in gammas)]
    for nu in nus:
        for policy in POLICIES:
            lines.append(row(f"{policy}({nu})") + "".join(f"{by[policy, nu, g] * 1e3:>9.1f}" for g in gammas))
    for nu in nus:
        lines.append(row(f"SG/BR({nu})") + "".join(f"{ratio[nu, g]:>8.2f}x" for g in gammas))
    for nu in (1, 4):
        paper = [paper_ratio(nu, g) for g in gammas]
        if all(p is not None for p in paper):
            lines.append(row(f"paper SG/BR({nu})") + "".join(f"{p:>8.2f}x" for p in paper))
    t = target(records)
    verdict = "holds" if t["holds"] else f"does NOT hold at gamma {t['failing_gammas']}"
    at_one = t["sg_over_br_at_gamma_1"]
    lines.append(f"target (BR faster than SG at every gamma > 0, nu = 1): {verdict}"
                 + (f"; SG/BR at gamma = 1: {at_one:.2f}x (paper 1.93x)" if at_one is not None else ""))
    return "\n".join(lines)


def format_movements(movements: list[dict]) -> str:
    """Each movement alone, BR vs SG, and their sum weighted by how often an MLP block uses it."""
    by = {(m["movement"], m["tensor"], m["policy"]): m for m in movements}
    lines = ["Movements alone (rank 1 hands all columns of the block to ranks 0, 2, 3; median ms, slowest rank):",
             f"{'movement':<13}{'block':<22}{'BR':>8}{'SG':>8}{'SG/BR':>8}  x/block  used by"]
    total = dict.fromkeys(POLICIES, 0.0)
    for movement, tensor, per_block, used_by in dict.fromkeys(
            (m["movement"], m["tensor"], m["per_block"], m["used_by"]) for m in movements):
        br, sg = (by[movement, tensor, policy] for policy in POLICIES)
        for policy, m in zip(POLICIES, (br, sg)):
            total[policy] += per_block * m["time_s"]
        block = f"{tensor} {br['shape'][0]}x{br['shape'][1]}"
        lines.append(f"{movement:<13}{block:<22}{br['time_s'] * 1e3:>8.2f}{sg['time_s'] * 1e3:>8.2f}"
                     f"{sg['time_s'] / br['time_s']:>7.2f}x  {per_block:>7}  {used_by}")
    br_total, sg_total = (total[p] * 1e3 for p in POLICIES)
    lines.append(f"{'sum per MLP block at gamma = 1, nu = 1':<35}{br_total:>8.2f}{sg_total:>8.2f}"
                 f"{sg_total / br_total:>7.2f}x")
    return "\n".join(lines)
