"""The generated tables of README.md and docs/results.md, from the result files in ``docs/results/``.

``docs/results/index.json`` lists one result file per question (the latest run of each): its id,
section, question, file, whether the compute was measured or emulated and, where the file has one,
the kind of table it renders.  Every result file carries a ``provenance`` object (command, commit,
machine, date).  A generated table in a document is the run of ``|`` lines right after a marker:

    <!-- result: ID -->             the table of the index's question ID
    <!-- results-index -->          the index itself: question, compute, command, file and date
    <!-- table: KIND FILE -->       the table of KIND for FILE (relative to the document)

:func:`regenerate` rewrites every marked table of a document and names the tables that changed;
:func:`audit` checks the results directory against its index.  ``scripts/readme_tables.py``
(``make tables``) writes the documents; ``--check`` only says what differs, and the test suite
runs the same checks, so a table that no longer matches its file fails CI.

Kinds:

``ttl``                  ``benchmarks/time_to_loss.py --json``: one row per mode, the median over
                         the repeats with the range when there are several; "what it did" from
                         the runs' summaries (re-plans, plans, bytes and seconds moved; the K
                         columns a rank shed; a static plan); results that carry the worst step
                         after warm-up get a column for it (against healthy's steady step);
``device-vs-throttle``   ``benchmarks/device_vs_throttle.py --json``;
``plans``                static uneven plans, each against its healthy even run;
``optimizer``            ``benchmarks/optimizer_bench.py --json``: each AdamW implementation's
                         median step and its ratio to the fused one;
``overhead``             ``benchmarks/overhead_bench.py --parts llm --json``: each variant's
                         median step and its paired ratio to Colossal-AI's layers;
``bench``                ``semimig bench --json``: the summary rows, each seed's accuracy delta to
                         the baseline (same seed and χ) and each seed's shed shares.

Numbers are printed from the files as they are (no rounding beyond the format), so a regenerated
document differs from the committed one only where a file changed.
"""
from __future__ import annotations

import json
import os
import re
import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

from semimig.errors import ConfigError

__all__ = ["MARKER", "RESULT", "INDEX_MARKER", "Index", "audit", "render", "regenerate", "RENDERERS"]

MARKER = re.compile(r"^<!-- table: (?P<kind>[a-z-]+) (?P<file>\S+) -->\s*$")
RESULT = re.compile(r"^<!-- result: (?P<id>[a-z0-9-]+) -->\s*$")
INDEX_MARKER = re.compile(r"^<!-- results-index -->\s*$")
PROVENANCE = ("command", "commit", "machine", "date")
"""What every result file's ``provenance`` object states."""
COMPUTE = ("measured", "emulated", "simulated")
"""How a result's figures were obtained: real compute, an emulated device, or the policy simulator."""
MAX_FILES = 46
"""The most files ``docs/results/`` holds: one per question, not its history."""


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _span(values: Sequence[float], fmt: str) -> str:
    """`` (lo–hi)`` over several values, empty for one."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return ""
    return f" ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _between(values: Sequence[float], fmt: str) -> str:
    """``lo–hi``, or one number where both print alike."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def _plan(mlp: Sequence[int], kv: Sequence[int]) -> str:
    return f"`{','.join(map(str, mlp))}:{','.join(map(str, kv))}`"


def _joined(values: Sequence[str]) -> str:
    unique = list(dict.fromkeys(values))
    return " or ".join(unique)


def _what_it_did(name: str, runs: Sequence[dict]) -> str:
    """The mode's actions over its repeats, from each run's summary."""
    if name == "healthy":
        return "—"
    summaries = [run.get("summary", {}) for run in runs]
    parts = []
    if name == "uneven":
        plans = [s.get("shard_plan", "?") for s in summaries]
        parts.append(f"static plan {_joined([f'`{p}`' for p in plans])}: exact")
    events = [s.get("reshard", {}).get("events", []) if isinstance(s.get("reshard"), dict) else []
              for s in summaries]
    if any(events):
        counts = sorted({len(e) for e in events})
        steps = _joined([",".join("probe" if ev["step"] < 0 else str(ev["step"]) for ev in e)  # probe: before step 0
                         for e in events if e])
        plans = _joined([" then ".join(_plan(ev["mlp_units"], ev["kv_units"]) for ev in e) for e in events if e])
        mb = [sum(ev["bytes_moved"] for ev in e) / 1e6 for e in events if e]
        secs = [sum(ev["move_s"] for ev in e) for e in events if e]
        n = "–".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts))
        at = f"step {steps}" if "probe" not in steps else steps.replace("probe", "the probe")
        parts.append(f"{n} re-plan{'s' if counts[-1] > 1 else ''} at {at} to {plans} "
                     f"({_between(mb, '.0f')} MB in {_between(secs, '.2f')} s)")
    elif name in ("reshard", "semi") and any("reshard" in s for s in summaries):
        parts.append("no re-plan")
    sheds = [[float(x) for x in str(s["shed"]).split(",")] for s in summaries if s.get("shed")]
    if sheds:
        for rank in range(len(sheds[0])):
            share = statistics.median(row[rank] for row in sheds if rank < len(row))
            if share >= 0.005:
                parts.append(f"rank {rank} shed {share:.0%} of its K columns at the end")
    if not parts:
        parts.append("nothing (Colossal-AI alone)" if name == "off" else "nothing shed at the end")
    return "; ".join(parts)


def ttl(data: dict) -> list[str]:
    """The time-to-the-same-model table (module docstring)."""
    modes, raw = data["modes"], data.get("raw", {})
    base = modes["healthy"]
    several = int(data.get("repeats", 1)) > 1
    pattern = data.get("pattern")
    rng = " (range)" if several else ""
    first = f"train time ({data['model']['steps']} steps)" if pattern else f"steady step{rng}"
    worst = all(m.get("worst_step_s") is not None for m in modes.values())  # results since the step reflex
    lines = [f"| mode | {first} | vs healthy |{' worst step |' if worst else ''} final val loss | to target{rng} | "
             "vs healthy | balanced share | what it did |", "|---|---|---|---|---|---|---|---|" + ("---|" if worst else "")]
    for name, m in modes.items():
        if pattern:
            time_cell, ratio = f"{m['train_s']:.1f} s", m["train_s"] / base["train_s"]
        else:
            spread = m.get("steady_step_s_range", ()) if several else ()
            time_cell = f"{m['steady_step_s']:.3f} s" + _span(spread, ".2f")
            ratio = m["steady_step_s"] / base["steady_step_s"]
        target = m.get("time_to_target_s")
        if target is None:
            target_cell, target_ratio = "never", "—"
        else:
            target_cell = f"{target:.1f} s" + _span(m.get("time_to_target_s_each", ()) if several else (), ".1f")
            target_ratio = _x(target / base["time_to_target_s"])
        shares = m.get("balanced_share") or []
        share_cell = " / ".join("—" if b is None else f"{b:.2f}" for b in shares) or "—"
        label = f"{name} (`--shard-plan`)" if name == "uneven" else name
        worst_cell = f" {_x(m['worst_step_s'] / base['steady_step_s'])} |" if worst else ""
        lines.append(f"| {label} | {time_cell} | {_x(ratio)} |{worst_cell} {m['final_val_loss']:.4f} | {target_cell} | "
                     f"{target_ratio} | {share_cell} | {_what_it_did(name, raw.get(name, []))} |")
    return lines


def device_vs_throttle(data: dict) -> list[str]:
    """Healthy, the real throttle and ``scope=device`` side by side (median over the repeats)."""
    runs, slow = data["runs"], data["slowdown_vs_healthy"]
    labels = {"healthy": "healthy", "real": f"real: {data['fraction']:.0%} of its core (cgroup)",
              "device": f"`scope=device`, χ = {data['chi']:g}"}
    lines = ["| rank 1 | steady step | vs healthy (median, range) | balanced share (rank 0 / 1) |",
             "|---|---|---|---|"]
    for name, label in labels.items():
        steady = statistics.median(r["steady_step_s"] for r in runs[name])
        shares = [statistics.median(r["balanced_share_by_rank"][q] for r in runs[name]) for q in range(2)]
        lines.append(f"| {label} | {steady:.3f} s | {_x(slow[name]['median'])}"
                     f"{_span(slow[name]['range'], '.2f')} | {shares[0]:.2f} / {shares[1]:.2f} |")
    return lines


def plans(data: dict) -> list[str]:
    """Static plans, each against the healthy even run of its model (with the range over repeats
    when a run has several: ``repeat_medians``)."""
    lines = ["| heads / KV heads | plan (MLP blocks : KV groups) | condition | median step | vs its healthy |",
             "|---|---|---|---|---|"]
    for run in data["runs"]:
        heads = run["heads/kv_heads"].replace("/", " / ")
        plan = "even" if run["plan"] == "even" else f"`{run['plan']}`"
        spread = _span(run.get("repeat_medians", ()), ".2f")
        lines.append(f"| {heads} | {plan} | {run['condition']} | {run['median_step_s']:.3f} s{spread} | "
                     f"{_x(run['vs_healthy'])} |")
    return lines


def optimizer(data: dict) -> list[str]:
    """The straggler's AdamW step per implementation (``benchmarks/optimizer_bench.py``)."""
    lines = ["| optimizer step (one rank's linear weights) | median | vs fused |", "|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['impl']} | {row['median_ms']:.1f} ms | {_x(row['vs_fused'])} |")
    return lines


def overhead(data: dict) -> list[str]:
    """Colossal-AI's layers, ``SemiMigPolicy`` and ``semimig.enable`` stepped in turn in one process
    (``benchmarks/overhead_bench.py --parts llm``): median step, paired ratio to Colossal-AI's."""
    labels = {"cai": "Colossal-AI's layers", "semimig": "`SemiMigPolicy`", "off": '`enable(mode="off")`',
              "semi": '`enable(mode="semi")`'}
    lines = ["| variant | median step | step / Colossal-AI's (median, interquartile range) |", "|---|---|---|"]
    for record in data["records"]:
        seconds, ratios = record["wall"]["seconds"], record["wall"]["ratio_to_cai"]
        for name, label in labels.items():
            ratio = "1" if name == "cai" else \
                f"{ratios[name]['median']:.3f} ({ratios[name]['q1']:.2f}–{ratios[name]['q3']:.2f})"
            lines.append(f"| {label} | {seconds[name]['median']:.3f} s | {ratio} |")
    return lines


def _seed_values(values: Sequence[float], fmt: str) -> str:
    """One number when every seed gave the same (to the format), else each seed's."""
    shown = [format(v, fmt) for v in values]
    return shown[0] if len(set(shown)) == 1 else ", ".join(shown)


def bench(data: dict) -> list[str]:
    """A ``semimig bench --json`` file: its summary rows, with each seed's accuracy delta and shed
    shares from its records (the straggler is the config's ``straggler_rank``)."""
    straggler = int(data["config"].get("straggler_rank", 1))
    records = data["records"]
    base_acc = {(r["chi"], r["seed"]): r.get("accuracy") for r in records if r["mode"] == "baseline"}
    lines = ["| mode | χ | iter s | RT / RT(χ=1) | ACC % | ACC − baseline (per seed) | straggler's shed | "
             "fast ranks' shed |", "|---|---|---|---|---|---|---|---|"]
    for row in data["summary"]:
        if row.get("lambda") is not None:
            continue
        mine = sorted((r for r in records if r["mode"] == row["mode"] and r["chi"] == row["chi"]
                       and r.get("lambda") is None), key=lambda r: r["seed"])
        acc = "—" if row.get("accuracy_mean") is None else \
            f"{100 * row['accuracy_mean']:.1f} ± {100 * (row.get('accuracy_std') or 0.0):.1f}"
        deltas = [100 * (r["accuracy"] - base_acc[r["chi"], r["seed"]]) for r in mine
                  if r.get("accuracy") is not None and base_acc.get((r["chi"], r["seed"])) is not None]
        if row["mode"] == "baseline" or row.get("acc_delta_vs_baseline") is None:
            delta = "0" if row["mode"] == "baseline" else "—"
        else:
            delta = f"{100 * row['acc_delta_vs_baseline']:+.1f}"
            if deltas and all(f"{d:.1f}" in ("0.0", "-0.0") for d in deltas):
                delta = "0 on every seed"
            else:
                if len(deltas) > 1:
                    delta += f" ({', '.join(f'{d:+.1f}' for d in deltas)})"
                if row.get("acc_delta_within_noise"):
                    delta += " (noise)"
        sheds = [r.get("shed_share_by_rank") or [] for r in mine]
        slow = _seed_values([s[straggler] if straggler < len(s) else 0.0 for s in sheds], ".2f")
        fast = _seed_values([max([x for q, x in enumerate(s) if q != straggler] or [0.0]) for s in sheds], ".2f")
        lines.append(f"| {row['label']} | {row['chi']:g} | {row['iter_time_s']:.3f} | {row['rt_vs_chi1']:.2f} | "
                     f"{acc} | {delta} | {slow} | {fast} |")
    return lines


RENDERERS: dict[str, Callable[[dict], list[str]]] = {"ttl": ttl, "device-vs-throttle": device_vs_throttle,
                                                     "plans": plans, "bench": bench, "optimizer": optimizer,
                                                     "overhead": overhead}


def _load(path: Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"{what} {path}: cannot read the result file ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: a result file holds a JSON object, got {type(data).__name__}")
    return data


def render(kind: str, path: Path) -> list[str]:
    """The table of ``kind`` for the result file ``path``; a bad kind or file is named."""
    if kind not in RENDERERS:
        raise ConfigError(f"README table kind {kind!r} is not one of {sorted(RENDERERS)}")
    data = _load(path, f"README table {kind}")
    try:
        return RENDERERS[kind](data)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
        raise ConfigError(f"README table {kind} {path}: not a {kind} result file ({err!r})") from None


class Index:
    """``docs/results/index.json``: the questions, each with its one result file (relative to the
    index's directory), validated on load; errors name the entry and the bad value."""

    KEYS = ("id", "section", "question", "file", "compute")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.directory = self.path.parent
        data = _load(self.path, "results index")
        entries = data.get("questions")
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"results index {self.path}: 'questions' must be a non-empty list")
        self.entries: dict[str, dict] = {}
        for n, entry in enumerate(entries):
            where = f"results index {self.path}: questions[{n}]"
            if not isinstance(entry, dict) or any(not isinstance(entry.get(k), str) for k in self.KEYS):
                raise ConfigError(f"{where} needs the strings {', '.join(self.KEYS)}, got {entry!r}")
            if entry["id"] in self.entries:
                raise ConfigError(f"{where}: id {entry['id']!r} is listed twice")
            if entry["compute"] not in COMPUTE:
                raise ConfigError(f"{where}: compute {entry['compute']!r} is not one of {COMPUTE}")
            if "table" in entry and entry["table"] not in RENDERERS:
                raise ConfigError(f"{where}: table {entry['table']!r} is not one of {sorted(RENDERERS)}")
            self.entries[entry["id"]] = entry

    def file(self, entry: dict) -> Path:
        return self.directory / entry["file"]

    def table(self, question: str) -> list[str]:
        """The table of the question ``question`` (its id)."""
        entry = self.entries.get(question)
        if entry is None:
            raise ConfigError(f"no question {question!r} in {self.path}; the ids are {sorted(self.entries)}")
        if "table" not in entry:
            raise ConfigError(f"question {question!r} in {self.path} renders no table (its file has no 'table' kind)")
        return render(entry["table"], self.file(entry))

    def overview(self, root: Path) -> list[str]:
        """The index as a table: question, compute, the command and where and when it ran."""
        lines = ["| question | compute | command | result file (date, commit) |", "|---|---|---|---|"]
        for entry in self.entries.values():
            prov = _load(self.file(entry), "results index").get("provenance", {})
            link = os.path.relpath(self.file(entry), root)
            lines.append(f"| {entry['question']} | {entry['compute']} | `{prov.get('command', '?')}` | "
                         f"[{entry['file']}]({link}) ({prov.get('date', '?')}, {str(prov.get('commit', '?'))[:7]}) |")
        return lines


def audit(index: Index) -> list[str]:
    """What keeps the results directory from being one current file per question: files the index
    does not list, listed files that are missing, a file without its provenance, too many files."""
    problems = []
    listed = {entry["file"] for entry in index.entries.values()}
    present = {p.relative_to(index.directory).as_posix() for p in index.directory.rglob("*") if p.is_file()}
    present.discard(index.path.name)
    problems += [f"{index.directory / f}: not in {index.path.name} (one file per question; git keeps old runs)"
                 for f in sorted(present - listed)]
    problems += [f"{index.directory / f}: listed in {index.path.name} but missing" for f in sorted(listed - present)]
    if len(present) + 1 > MAX_FILES:
        problems.append(f"{index.directory}: {len(present) + 1} files, more than {MAX_FILES}")
    for f in sorted(listed & present):
        if not f.endswith(".json"):
            continue
        prov = _load(index.directory / f, "result").get("provenance")
        missing = [k for k in PROVENANCE if not isinstance(prov, dict) or not prov.get(k)]
        if missing:
            problems.append(f"{index.directory / f}: provenance lacks {', '.join(missing)}")
    return problems


def regenerate(text: str, root: Path, index: Optional[Index] = None) -> tuple[str, list[str], int]:
    """``text`` with every marked table rendered afresh from its file (a ``table`` marker's file
    relative to ``root``, a ``result`` marker's from ``index``); the markers whose tables changed,
    and how many marked tables there are."""
    lines = text.split("\n")
    out: list[str] = []
    changed: list[str] = []
    marked = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        table, result, overview = MARKER.match(line), RESULT.match(line), INDEX_MARKER.match(line)
        if not (table or result or overview):
            continue
        if (result or overview) and index is None:
            raise ConfigError(f"{line.strip()} needs the results index (docs/results/index.json)")
        marked += 1
        old = []
        while i < len(lines) and lines[i].startswith("|"):
            old.append(lines[i])
            i += 1
        if table:
            new = render(table["kind"], root / table["file"])
        elif result:
            new = index.table(result["id"])
        else:
            new = index.overview(root)
        if new != old:
            changed.append(line.strip())
        out.extend(new)
    return "\n".join(out), changed, marked


DOCUMENTS = (Path("README.md"), Path("docs/results.md"))
"""The documents ``make tables`` keeps: the README's headline results and the results page."""
INDEX = Path("docs/results/index.json")
"""The results index, relative to the repository root."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``scripts/readme_tables.py [--check] [--index FILE] [DOCUMENT ...]``: write the marked tables
    of each document (default :data:`DOCUMENTS`, relative to the working directory), or check them
    and the results directory (:func:`audit`).  A ``table`` marker's file is relative to its own
    document."""
    import argparse

    parser = argparse.ArgumentParser(description="regenerate the tables of README.md and docs/ from docs/results/")
    parser.add_argument("documents", nargs="*", type=Path, help=f"default: {' '.join(map(str, DOCUMENTS))}")
    parser.add_argument("--index", type=Path, default=INDEX, help=f"the results index (default {INDEX})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the tables that differ and what the results lack")
    args = parser.parse_args(argv)
    index = Index(args.index) if args.index.exists() else None
    stale = 0
    if args.check and index is not None:
        for problem in audit(index):
            print(problem)
            stale += 1
    for document in args.documents or DOCUMENTS:
        try:
            text = document.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read {document}: {err}") from None
        new, changed, marked = regenerate(text, document.resolve().parent, index)
        stale += len(changed)
        if args.check:
            for marker in changed:
                print(f"{document}: differs from its file: {marker}")
            print(f"{document}: {marked} generated table(s), {len(changed)} out of date")
            continue
        if new != text:
            from semimig._io import write_atomically

            write_atomically(document, new)
        print(f"{document}: {marked} generated table(s), {len(changed)} rewritten")
    return 1 if args.check and stale else 0
