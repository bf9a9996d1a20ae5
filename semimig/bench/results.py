"""The results file of ``semimig bench``: one JSON rewritten atomically after every finished case.

    {"records": [...], "summary": [...], "machine": {...}, "config": {...},
     "status": {"complete": false, "cases_done": 3, "cases_total": 14}}

Each record is one trained case ``(mode, chi, seed, λ)``: its summaries (times, accuracy, per-rank
shares) and the group's per-iteration ``trajectory.iter_time_s``.  The per-rank traces
(``trajectory.by_rank``: every rank's busy time, γs, savings and migrations at every iteration;
``trajectory.decisions``: the group's decision at every iteration) are most of a record's size
(a 4-rank, 300-iteration case: ~0.5 MB) and no table or plot reads them; they are kept only with
``semimig bench --full-trace`` (:data:`TRACE_KEYS`, :func:`slim_record`).  After each case the whole file is
written to a temporary file in the same directory and renamed over the old one, so an interrupt
(Ctrl-C, SIGTERM, a failed rank, a power cut) leaves either the previous or the new complete file,
never a torn one, and every finished case is kept.

Settings: two runs are the "same experiment" when their configs agree on every key but the sweep
axes (:data:`SWEEP_KEYS`) and the keys that do not change a result (:data:`RUN_ONLY_KEYS`).
``--resume`` keeps the cases of an existing file with the same settings and trains only the
missing ones; the finished cases of an existing file are never replaced without ``--overwrite``
(same settings and no ``--resume`` is refused, naming both flags).

Summaries: :func:`summarize` (1-D TP runs: per mode, λ and chi) and :func:`summarize_grid` (2-D runs: per
mode) are the rows stored under ``"summary"`` and read by the table and plots of
:mod:`semimig.bench.report` and :mod:`semimig.bench.grid`; accuracy is compared with the baseline per seed
(:func:`acc_delta`).  This module imports neither of those two (they read results; nothing reads back up).
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from semimig._io import check_apart, check_output_dir, check_output_file, write_json
from semimig.bench.schema import is_grid
from semimig.errors import ConfigError

SWEEP_KEYS = ("modes", "chis", "seeds", "lambdas")
"""Config keys along which runs of one experiment may differ (merged as unions)."""
RUN_ONLY_KEYS = ("timeout_s",)
"""Config keys that change how a run is supervised, not what it measures."""

TRACE_KEYS = ("by_rank", "decisions")
"""The keys of a record's ``trajectory`` kept only with ``--full-trace`` (per-rank and per-decision traces)."""

Case = tuple  # (mode, chi, seed, lambda)


def slim_record(record: dict) -> dict:
    """``record`` without the per-rank traces (:data:`TRACE_KEYS` of its ``trajectory``).

    Everything else stays: the summaries the table and plots read, and the per-iteration series
    ``trajectory.iter_time_s``.  A record without those traces is returned as it is.
    """
    trajectory = record.get("trajectory")
    if not isinstance(trajectory, dict) or not any(key in trajectory for key in TRACE_KEYS):
        return record
    return {**record, "trajectory": {k: v for k, v in trajectory.items() if k not in TRACE_KEYS}}


def case_of(record: dict) -> Case:
    """The case a record measured: ``(mode, chi, seed, λ)`` (chi ``None`` for 2-D records)."""
    return normal_case((record["mode"], record.get("chi"), record["seed"], record.get("lambda")))


def normal_case(case: Case) -> Case:
    """``case`` with chi as a float (or ``None``) and the seed as an int, for comparisons."""
    mode, chi, seed, lam = case
    return (mode, None if chi is None else float(chi), int(seed), lam)


def describe_case(case: Case) -> str:
    mode, chi, seed, lam = case
    return f"{mode}{'' if lam is None else f' λ={lam}'}{'' if chi is None else f' chi={chi:g}'} seed={seed}"


def as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, dataclasses dicts via the caller)."""
    return json.loads(json.dumps(value, default=str))


def settings_difference(a: dict, b: dict) -> Optional[str]:
    """``None`` if configs ``a`` and ``b`` describe the same experiment, else the first differing key."""
    skip = set(SWEEP_KEYS) | set(RUN_ONLY_KEYS)
    for key in sorted((set(a) | set(b)) - skip):
        if key not in a or key not in b:
            return f"{key!r} is only in {'the file' if key in b else 'this run'}"
        if a[key] != b[key]:
            return f"{key!r} is {b[key]!r} in the file but {a[key]!r} in this run"
    return None


def check_outputs(json_path: Path, plots: Optional[Path], *, inputs: Sequence[Path] = ()) -> None:
    """``--json`` and (when plots are drawn) ``--plots``, before any training (not after an hour)."""
    if plots is not None:  # before anything is created: --plots's directory would be made at --json's path
        check_apart((("--json", json_path), ("--plots", plots)))
    check_output_file(json_path, "--json", inputs=inputs, make_parents=True)
    if plots is not None:
        check_output_dir(plots, "--plots")


class ResultsFile:
    """The records of one run (and, with ``resume``, the kept records of an earlier one)."""

    def __init__(self, path: Path, config: dict, *, machine: dict, records: Sequence[dict] = (),
                 full_trace: bool = False) -> None:
        self.path = Path(path)
        self.config = as_json(config)
        self.machine = machine
        self.records = list(records)
        self.full_trace = full_trace
        """Keep each new record's per-rank traces (:data:`TRACE_KEYS`); kept records stay as they were."""

    @classmethod
    def open(cls, path: Path, config: dict, *, machine: dict, resume: bool, overwrite: bool,
             full_trace: bool = False) -> "ResultsFile":
        """Check ``path`` against this run's settings before any training (errors name the fix).

        No file (or one with no finished case): a fresh run.  A file with the same settings: kept
        with ``resume``; without it refused, naming ``--resume`` and ``--overwrite``, because a
        fresh run would replace its finished cases.  A file with other settings, or not written by
        ``semimig bench``: refused unless ``overwrite``.  Only ``overwrite`` ever replaces cases.
        """
        from semimig.bench.schema import validate_saved

        if resume and overwrite:
            raise ConfigError("--resume keeps the cases in the results file and --overwrite discards them: "
                              "give one of them")
        path = Path(path)
        config = as_json(config)
        if not path.exists() or overwrite:
            return cls(path, config, machine=machine, full_trace=full_trace)
        try:
            saved = validate_saved(json.loads(path.read_text()), str(path))
        except (OSError, ValueError) as err:
            raise ConfigError(f"--json {path} exists and is not a semimig bench result ({err}); "
                              "pass --overwrite to replace it or choose another --json") from None
        except RecursionError:  # json's decoder recurses once per nesting level
            raise ConfigError(f"--json {path} exists and nests too deeply to be a semimig bench result; "
                              "pass --overwrite to replace it or choose another --json") from None
        difference = settings_difference(config, saved["config"])
        if difference is not None:
            raise ConfigError(f"--json {path} holds a run with other settings ({difference}); pass --overwrite "
                              "to replace it or choose another --json")
        if not resume:
            if not saved["records"]:
                return cls(path, config, machine=machine, full_trace=full_trace)  # nothing finished: nothing to lose
            n = len(saved["records"])
            raise ConfigError(f"--json {path} already holds {n} finished case{'s' if n != 1 else ''} of this "
                              "experiment; pass --resume to keep them and train only the missing cases, "
                              "or --overwrite to replace the file, or choose another --json")
        merged = dict(config)
        for key in SWEEP_KEYS:
            merged[key] = list(dict.fromkeys([*saved["config"].get(key, []), *config.get(key, [])]))
        return cls(path, merged, machine=machine, records=saved["records"], full_trace=full_trace)

    @property
    def done(self) -> set:
        return {case_of(r) for r in self.records}

    def missing(self, cases: Iterable[Case]) -> list:
        done = self.done
        return [c for c in cases if normal_case(c) not in done]

    def add(self, record: dict, *, cases_total: int) -> None:
        """Append one finished case and rewrite the file atomically: :attr:`records` holds the case exactly when
        the file does, whatever interrupts the write (a signal after the file's rename keeps it in both)."""
        if not self.full_trace:
            record = slim_record(record)
        self.records.append(record)
        try:
            self.write(complete=False, cases_total=cases_total)
        except BaseException:
            if not self._saved_last():
                self.records.pop()
            raise

    def _saved_last(self) -> bool:
        """Whether the file on disk holds :attr:`records`, the last one included (as JSON reads it back): the
        write reached its rename.  A file of another run (``--overwrite``) never does."""
        try:
            saved = json.loads(self.path.read_text())["records"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        same = json.dumps(saved[-1], sort_keys=True) == json.dumps(as_json(self.records[-1]), sort_keys=True) if saved else False
        return len(saved) == len(self.records) and same  # compared as text: a NaN equals itself there

    def write(self, *, complete: bool, cases_total: int, records: Optional[list] = None) -> None:
        records = self.records if records is None else records
        rows = summarize_grid(records) if is_grid(self.config) else summarize(records)
        data = {"records": records, "summary": rows, "machine": self.machine, "config": self.config,
                "status": {"complete": complete, "cases_done": len(records), "cases_total": cases_total}}
        write_json(self.path, data)


def summarize(records: Sequence[dict]) -> list[dict]:
    """Per (mode, λ, chi): mean epoch/iteration time, accuracy mean ± std over seeds, RT vs chi = 1.

    ``label`` names the row (``semi λ=2`` for a λ-sweep run); a λ row's RT is relative to plain
    ``semi`` at chi = 1 (with no straggler there is nothing to sweep).  Accuracy is ``None`` for
    time-only runs.  ``acc_delta_vs_baseline`` is the mean over the seeds both measured of the
    per-seed difference to the baseline (same seed, same chi); ``acc_delta_std`` its spread over
    those seeds (``None`` below two seeds: no noise estimate), and ``acc_delta_within_noise`` says
    whether ``|delta| <= std`` — such a delta is not a gain or a loss.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["mode"], r.get("lambda"), r["chi"])].append(r)
    rows = []
    for (mode, lam, chi), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1], kv[0][2])):
        acc = [r["accuracy"] for r in rs if r.get("accuracy") is not None]
        rows.append({
            "mode": mode, "lambda": lam, "label": mode if lam is None else f"{mode} λ={lam}",
            "chi": chi, "seeds": len(rs),
            "iter_time_s": statistics.mean(r["iter_time_s"] for r in rs),
            "epoch_time_s": statistics.mean(r["epoch_time_s"] for r in rs),
            "epoch_time_range": ([min(r["epoch_time_s"] for r in rs), max(r["epoch_time_s"] for r in rs)]
                                 if len(rs) > 1 else None),
            "accuracy_mean": statistics.mean(acc) if acc else None,
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else (0.0 if acc else None),
            "migrating_stragglers": statistics.mean(r.get("migrating_stragglers", 0) for r in rs),
            "busy_share": _mean_busy_share(rs),
            "balanced_share_by_rank": _mean_by_rank(rs, "balanced_share_by_rank"),
            "_by_seed": {r["seed"]: r.get("accuracy") for r in rs},
        })
    base_time = {row["mode"]: row["iter_time_s"] for row in rows if row["chi"] == 1.0 and row["lambda"] is None}
    base_acc = {row["chi"]: row["_by_seed"] for row in rows if row["mode"] == "baseline" and row["lambda"] is None}
    for row in rows:
        ref = base_time.get(row["mode"])
        row["rt_vs_chi1"] = row["iter_time_s"] / ref if ref else None
        row.update(acc_delta(row.pop("_by_seed"), base_acc.get(row["chi"], {})))
    return rows


def _mean_busy_share(records: Sequence[dict]) -> float | None:
    """Mean over records and ranks of the share of the iteration each rank was busy (its GEMMs and
    their injected delays): at chi = 1 in measured compute, the share of the TP linear GEMMs."""
    shares = [s for r in records for s in r.get("busy_share_by_rank") or () if isinstance(s, (int, float))]
    return statistics.mean(shares) if shares else None


def _mean_by_rank(records: Sequence[dict], key: str) -> list | None:
    """Per rank, the mean of ``key``'s per-rank values over the records that have them (``None``: none do)."""
    columns = [r.get(key) for r in records if r.get(key)]
    if not columns:
        return None
    return [statistics.mean(v for v in values if isinstance(v, (int, float))) if any(
        isinstance(v, (int, float)) for v in values) else None for values in zip(*columns)]


def acc_delta(mine: dict, baseline: dict) -> dict:
    """Paired per-seed accuracy differences to the baseline: mean, spread, within the noise."""
    diffs = [mine[s] - baseline[s] for s in mine if mine[s] is not None and baseline.get(s) is not None]
    if not diffs:
        return {"acc_delta_vs_baseline": None, "acc_delta_std": None, "acc_delta_within_noise": None}
    delta = statistics.mean(diffs)
    std = statistics.stdev(diffs) if len(diffs) > 1 else None
    return {"acc_delta_vs_baseline": delta, "acc_delta_std": std,
            "acc_delta_within_noise": None if std is None else abs(delta) <= std}


MODE_ORDER = ("baseline", "poplar", "semi", "poplar+semi")
"""The row order of a 2-D summary (other modes after, by name)."""


def summarize_grid(records: Sequence[dict]) -> list[dict]:
    """2-D records (``semimig bench --allocation``), per mode: mean times, speed-up vs baseline, group samples, accuracy mean ± std and delta."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[r["mode"]].append(r)
    order = sorted(groups, key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m))
    rows = []
    for mode in order:
        rs = groups[mode]
        acc = [r["accuracy"] for r in rs if r.get("accuracy") is not None]
        rows.append({
            "mode": mode, "seeds": len(rs),
            "iter_time_s": statistics.mean(r["iter_time_s"] for r in rs),
            "iter_time_std": statistics.stdev([r["iter_time_s"] for r in rs]) if len(rs) > 1 else None,
            "epoch_time_s": statistics.mean(r["epoch_time_s"] for r in rs),
            "group_samples_first": rs[0].get("group_samples_first"),
            "group_samples": rs[0].get("group_samples"),
            "replans": statistics.mean(len(r.get("replans") or ()) for r in rs),
            "accuracy_mean": statistics.mean(acc) if acc else None,
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else (0.0 if acc else None),
            "_by_seed": {r["seed"]: r.get("accuracy") for r in rs},
        })
    base = next((row for row in rows if row["mode"] == "baseline"), None)
    for row in rows:
        row["speedup_vs_baseline"] = base["iter_time_s"] / row["iter_time_s"] if base else None
        row.update(acc_delta(row.pop("_by_seed"), {} if base is None else
                              {r["seed"]: r.get("accuracy") for r in groups["baseline"]}))
    return rows
