"""The report of ``benchmarks/migration_bench.py``: Table I, SG/BR ratios, bytes, an α–β estimate.

Pure functions of the records the ranks return (no torch), so a saved JSON can be re-read:

- ``ratios`` divides scatter-gather's median iteration time by broadcast-reduce's per
  ``(nu, gamma)``, and the same per round (the spread); ``target`` checks broadcast-reduce wins
  at every ``gamma > 0`` with one migrating rank (the paper: 963 / 500 = 1.93x at ``gamma = 1``).
- ``straggler_traffic`` works out, from DESIGN §2, the calls and bytes that migration puts
  through a migrating straggler's own link per iteration (pipelined collectives: a broadcast
  root sends its block once, a reduce root receives it once; scatter-gather sends and receives
  every slice and every whole tensor per receiver).  The bench's counted bytes must equal it.
- ``fit_link`` fits ``t(B) = alpha + beta B`` to a message-size sweep; ``alpha_beta_estimate``
  prices each policy's straggler-link traffic with such constants for another setting (the
  paper's: 8 ranks, one straggler, its link the bottleneck): ``T = calls alpha' + beta (out + in)``,
  ``alpha' = alpha ceil(log2 e)`` for a tree collective and ``alpha`` for a point-to-point message.
"""
from __future__ import annotations

import math

from semimig._fit import line_fit

POLICIES = ("broadcast-reduce", "scatter-gather")
GAMMAS = (0.0, 0.25, 0.5, 0.75, 1.0)
# Paper Table I: seconds per epoch, gammas 0 .. 1, nu = 1 and nu = 4.
PAPER_TABLE = {
    ("broadcast-reduce", 1): (373, 425, 451, 473, 500),
    ("scatter-gather", 1): (373, 478, 627, 796, 963),
    ("broadcast-reduce", 4): (373, 737, 846, 998, 1113),
    ("scatter-gather", 4): (373, 779, 971, 1198, 1436),
}
GLOO_CAVEAT = (
    "gloo on one machine is not a NIC-bound cluster: no byte crosses a network link, every byte is a memory copy "
    "on the shared cores, gloo's broadcast is an unpipelined binomial tree (its root sends the block once per tree "
    "level) and its reduce a ring, so the straggler's link is never the bottleneck that makes broadcast-reduce win "
    "in the paper; the byte counts and the alpha-beta estimate say what that link would carry and cost.")


def paper_ratio(nu: int, gamma: float) -> float | None:
    """The paper's SG/BR epoch-time ratio at ``(nu, gamma)``; ``None`` where Table I has no such column."""
    if ("broadcast-reduce", nu) not in PAPER_TABLE or gamma not in GAMMAS:
        return None
    i = GAMMAS.index(gamma)
    return PAPER_TABLE["scatter-gather", nu][i] / PAPER_TABLE["broadcast-reduce", nu][i]


def ratios(records: list[dict]) -> list[dict]:
    """SG/BR median-time ratio per (nu, gamma), its per-round min/max, and the paper's where it has that nu."""
    by = {(r["policy"], r["nu"], r["gamma"]): r for r in records}
    out = []
    for nu, gamma in sorted({(r["nu"], r["gamma"]) for r in records}):
        if ("broadcast-reduce", nu, gamma) in by and ("scatter-gather", nu, gamma) in by:
            br, sg = by["broadcast-reduce", nu, gamma], by["scatter-gather", nu, gamma]
            entry = {"nu": nu, "gamma": gamma, "sg_over_br": sg["iter_time_s"] / br["iter_time_s"]}
            rounds = [s / b for s, b in zip(sg.get("round_medians_s", ()), br.get("round_medians_s", ()))]
            if rounds:
                entry.update(rounds_min=min(rounds), rounds_max=max(rounds), rounds=len(rounds))
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


# ----------------------------------------------------------------------------- bytes through the straggler
def straggler_traffic(policy: str, nu: int, gamma: float, *, hidden: int, tokens: int, blocks: int, world: int,
                      bytes_per_element: int = 4, algorithm: str = "tree") -> dict:
    """Per iteration: migration's calls and bytes through one migrating straggler's link (all-reduces excluded).

    Per MLP block, ``M`` tokens, column layer ``N = 4H/e, L = round(gamma H)``, row layer
    ``N = H, L = round(gamma 4H/e)``, ``R`` active receivers (``min(e - nu, L)``)::

        broadcast-reduce  out: col N L (W_k) + M N (dY_k);  row M L (X_k) + N L (W_k)       4 broadcasts
                          in : col M N (Y)   + N L (dW_k);  row (M + N) L (dX_k, dW_k)      3 reduces
        scatter-gather    out: col N L + R M N;             row M L + N L                   (2 + 2) R sends
                          in : col R M N + M L + N L;       row R M N + (M + N) L           (3 + 2) R receives

    With ``nu > 1`` under broadcast-reduce's ``tree`` algorithm, the straggler also takes the peer
    side of the other stragglers' collectives (they span the whole group): in for their
    broadcasts, out for their reduces.  Under ``direct`` (semimig.migration.exchange) only the
    root and the receivers take part, and neither it nor scatter-gather involves a straggler in
    another's messages.  ``alpha_hops``: message latencies on the straggler's critical path, for
    the alpha-beta estimate: ``ceil(log2 e)`` per tree collective, one per point-to-point message,
    and under ``direct`` one per scatter/gather and two per scatter + all-gather (``dY_k``) or
    reduce-scatter + gather (partial ``Y``): 6 per column layer, 3 per row layer (a key of the
    result under ``direct`` only).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if algorithm not in ("direct", "tree"):
        raise ValueError(f"algorithm must be 'direct' or 'tree', got {algorithm!r}")
    direct = policy == "broadcast-reduce" and algorithm == "direct"
    hops = 0
    m, h, k_row = tokens, hidden, 4 * hidden // world
    col_n, col_l, row_n, row_l = k_row, round(gamma * h), h, round(gamma * k_row)
    out = in_ = calls = 0
    for n, l, kind in ((col_n, col_l, "col"), (row_n, row_l, "row")):
        if l == 0:
            continue
        r = min(world - nu, l)
        if policy == "broadcast-reduce":
            sent, received, n_calls = (n * l + m * n, m * n + n * l, 4) if kind == "col" else (m * l + n * l, (m + n) * l, 3)
            if direct:  # own movements only
                out, in_, calls, hops = out + sent, in_ + received, calls + n_calls, hops + (6 if kind == "col" else 3)
                continue
            # own collectives as the root, the other stragglers' as a peer
            out, in_, calls = out + sent + (nu - 1) * received, in_ + received + (nu - 1) * sent, calls + nu * n_calls
        elif kind == "col":
            out, in_, calls = out + n * l + r * m * n, in_ + r * m * n + m * l + n * l, calls + 5 * r
        else:
            out, in_, calls = out + m * l + n * l, in_ + r * m * n + (m + n) * l, calls + 4 * r
    scale = blocks * bytes_per_element
    tree_calls = blocks * calls if policy == "broadcast-reduce" and not direct else 0
    out_dict = {"calls": blocks * calls, "out_bytes": scale * out, "in_bytes": scale * in_, "tree_calls": tree_calls}
    if direct:
        out_dict["alpha_hops"] = blocks * hops
    return out_dict


def fit_link(sizes: list[int], seconds: list[float]) -> dict:
    """Least-squares ``t(B) = alpha + beta B`` over a message-size sweep: ``{"alpha_s", "beta_s_per_byte"}``."""
    if len(set(sizes)) < 2 or len(sizes) != len(seconds):
        raise ValueError(f"a link fit needs two or more message sizes with one time each, got {sizes} / {seconds}")
    alpha, beta = line_fit(sizes, seconds)
    return {"alpha_s": alpha, "beta_s_per_byte": beta,
            "bandwidth_gb_s": 1e-9 / beta if beta > 0 else None}


def alpha_beta_estimate(link: dict, *, hidden: int, tokens: int, blocks: int, world: int = 8, nu: int = 1,
                        gammas: tuple[float, ...] = GAMMAS, algorithm: str = "tree") -> list[dict]:
    """Migration's straggler-link time per iteration for each policy and gamma, priced with ``link``:
    ``alpha_hops alpha + beta (out + in)`` (``algorithm``: broadcast-reduce's, see :func:`straggler_traffic`)."""
    alpha, beta = max(link["alpha_s"], 0.0), link["beta_s_per_byte"]
    rows = []
    for gamma in gammas:
        row = {"world": world, "nu": nu, "gamma": gamma}
        for policy in POLICIES:
            t = straggler_traffic(policy, nu, gamma, hidden=hidden, tokens=tokens, blocks=blocks, world=world,
                                  algorithm=algorithm)
            hops = t.get("alpha_hops", t["calls"] - t["tree_calls"] + t["tree_calls"] * math.ceil(math.log2(world)))
            row[policy] = {**t, "time_s": hops * alpha + beta * (t["out_bytes"] + t["in_bytes"])}
        br, sg = row["broadcast-reduce"]["time_s"], row["scatter-gather"]["time_s"]
        row["sg_over_br"] = sg / br if br > 0 else None
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- tables
def format_table(records: list[dict], cfg) -> str:
    """The paper's Table I layout in ms, SG/BR rows (ours with the per-round range, the paper's), the target.

    ``cfg`` is the run's ``migration_bench.BenchConfig`` (read for the header only).
    """
    gammas = sorted({r["gamma"] for r in records})
    nus = sorted({r["nu"] for r in records})
    by = {(r["policy"], r["nu"], r["gamma"]): r["iter_time_s"] for r in records}
    ratio = {(r["nu"], r["gamma"]): r for r in ratios(records)}
    row = "{:<22}".format
    compute = ("measured: real GEMMs, nothing emulated" if cfg.device_ms == 0
               else f"EMULATED device: every rank's GEMMs also sleep, {cfg.device_ms:g} ms/iteration")
    lines = [f"Table I on CPU/gloo ({compute}): median iteration time (ms) over {records[0]['iterations']} "
             f"iterations; e={cfg.world}, H={cfg.hidden}, tokens={cfg.tokens}, blocks={cfg.blocks}",
             row("policy(nu) / gamma") + "".join(f"{g:>19.2f}" for g in gammas)]
    for nu in nus:
        for policy in POLICIES:
            lines.append(row(f"{policy}({nu})") + "".join(f"{by[policy, nu, g] * 1e3:>19.1f}" for g in gammas))
    for nu in nus:
        cells = []
        for g in gammas:
            r = ratio[nu, g]
            spread = f" [{r['rounds_min']:.2f}-{r['rounds_max']:.2f}]" if "rounds_min" in r else ""
            cells.append(f"{r['sg_over_br']:.2f}x{spread}".rjust(19))
        lines.append(row(f"SG/BR({nu}) [rounds]") + "".join(cells))
    for nu in (1, 4):
        paper = [paper_ratio(nu, g) for g in gammas]
        if all(p is not None for p in paper):
            lines.append(row(f"paper SG/BR({nu})") + "".join(f"{p:>18.2f}x" for p in paper))
    t = target(records)
    verdict = "holds" if t["holds"] else f"does NOT hold at gamma {t['failing_gammas']}"
    at_one = t["sg_over_br_at_gamma_1"]
    lines.append(f"target (BR faster than SG at every gamma > 0, nu = 1): {verdict}"
                 + (f"; SG/BR at gamma = 1: {at_one:.2f}x (paper 1.93x)" if at_one is not None else ""))
    return "\n".join(lines)


def format_traffic(records: list[dict]) -> str:
    """Bytes through the migrating straggler's link per iteration (counted at the calls), MiB out / in."""
    lines = ["Migration traffic through the straggler's link per iteration (counted; all-reduces excluded), "
             "MiB out / in, calls:"]
    for r in sorted(records, key=lambda r: (r["nu"], r["gamma"], r["policy"])):
        link = r.get("straggler_link")
        if link is None or r["gamma"] == 0:
            continue
        lines.append(f"  {r['policy']:<17}({r['nu']}) gamma {r['gamma']:.2f}: {link['out_bytes'] / 2**20:8.2f} / "
                     f"{link['in_bytes'] / 2**20:8.2f}  ({link['calls']} calls)")
    return "\n".join(lines)


def format_estimate(links: dict, estimates: dict) -> str:
    """Measured link constants and the alpha-beta estimate for the paper's setting, plus the caveat."""
    lines = ["Link constants measured on this machine (gloo, loopback; fastest message per size), t(B) = alpha + beta B:"]
    for name, fit in links.items():
        bw = fit["bandwidth_gb_s"]
        lines.append(f"  {name:<10} alpha {fit['alpha_s'] * 1e6:8.1f} us   beta {fit['beta_s_per_byte'] * 1e9:8.4f} ns/B"
                     + (f"   ({bw:.2f} GB/s)" if bw else ""))
    for name, rows in estimates.items():
        first = rows[0]
        lines.append(f"alpha-beta estimate, {name}: e={first['world']}, nu={first['nu']}, straggler-link bound, "
                     "migration traffic only (ms per iteration):")
        lines.append(f"  {'gamma':>6} {'BR':>9} {'SG':>9} {'SG/BR':>7}")
        for row in rows:
            br, sg = row["broadcast-reduce"]["time_s"] * 1e3, row["scatter-gather"]["time_s"] * 1e3
            ratio = f"{row['sg_over_br']:6.2f}x" if row["sg_over_br"] else "     -"
            lines.append(f"  {row['gamma']:>6.2f} {br:>9.3f} {sg:>9.3f} {ratio}")
    lines.append("Caveat: " + GLOO_CAVEAT)
    return "\n".join(lines)


def format_movements(movements: list[dict]) -> str:
    """Each movement alone, BR vs SG, and their sum weighted by how often an MLP block uses it."""
    by = {(m["movement"], m["tensor"], m["policy"]): m for m in movements}
    lines = ["Movements alone (rank 1 hands all columns of the block to the others; median ms, slowest rank):",
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
