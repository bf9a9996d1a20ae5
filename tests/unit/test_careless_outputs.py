"""No output path in the project replaces an existing file without ``--overwrite``.

Every ``argparse`` parser of the project is walked: the ``semimig`` command's subcommands, the
example and every script under ``benchmarks/`` (loaded as modules; a parser is captured the moment
the script first parses, before it does any work).  Each flag whose name says it is a path (json,
log, out, save, plot, png, csv, dir, file, path, trace, resume) must be either an output with a
case below, which points it at an existing file and expects a refusal naming ``--overwrite`` with
the file untouched, or one of the explicit :data:`NOT_OUTPUTS`.  A new path flag that is neither
fails the walk.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scripts import REPO
from scripts import load_script as _load


def load_script(relative: str, name: str):
    """:func:`scripts.load_script`, the module registered while it runs (a script's dataclasses need it)."""
    import sys
    import types

    sys.modules[name] = types.ModuleType(name)  # dataclasses look their module up while the script runs
    try:
        module = _load(relative, name)
    finally:
        del sys.modules[name]
    return module

PATH_WORDS = ("json", "log", "out", "save", "plot", "png", "csv", "dir", "file", "path", "trace", "resume")

NOT_OUTPUTS = {
    ("finetune_llm", "--resume"): "reads a checkpoint (never written)",
    ("finetune_llm", "--save"): "a checkpoint directory: refused when not empty, even with --overwrite",
    ("llm_run", "--resume"): "reads a checkpoint (never written)",
    ("llm_run", "--save"): "a checkpoint directory: refused when not empty, even with --overwrite",
}
"""Path flags that are not output files, each with the reason."""


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@pytest.fixture
def capture(monkeypatch):
    """``capture(call)``: the first parser ``call`` parses with (nothing of the script runs past its parse)."""
    original = argparse.ArgumentParser.parse_known_args
    state = {"on": False}

    def parse_known_args(self, args=None, namespace=None):
        if state["on"]:
            raise _Captured(self)
        return original(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)

    def run(call) -> argparse.ArgumentParser:
        state["on"] = True
        try:
            call()
        except _Captured as got:
            return got.parser
        finally:
            state["on"] = False
        raise AssertionError(f"{call} never parsed")

    return run


def _script_parsers(capture) -> dict[str, argparse.ArgumentParser]:
    parsers = {}
    scripts = [("examples/finetune_llm.py", "finetune_llm")] + [
        (f"benchmarks/{p.name}", p.stem) for p in sorted((REPO / "benchmarks").glob("*.py"))]
    for relative, name in scripts:
        module = load_script(relative, f"{name}_walked")
        entry = getattr(module, "parse_args", None) or getattr(module, "main", None)
        if entry is None:
            continue  # a library of the scripts (bench_output) or a module without a command line
        if entry.__code__.co_argcount:
            parsers[name] = capture(lambda: entry([]))
        else:  # main() reading sys.argv
            import sys

            argv, sys.argv = sys.argv, [relative]
            try:
                parsers[name] = capture(entry)
            finally:
                sys.argv = argv
    return parsers


def _cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from semimig.cli import build_parser

    out = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({f"semimig {name}": parser for name, parser in action.choices.items()})
    return out


def _path_flags(parser: argparse.ArgumentParser) -> list[str]:
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.type in (int, float):
            continue
        name = max(action.option_strings, key=len)
        if any(word in name for word in PATH_WORDS):
            flags.append(name)
    return flags


def test_every_path_flag_of_every_parser_is_an_output_with_a_case_or_a_named_exception(capture):
    parsers = {**_cli_parsers(), **_script_parsers(capture)}
    assert {"semimig bench", "semimig throttle", "semimig cluster", "finetune_llm", "llm_run", "time_to_loss"} <= parsers.keys()
    found = {(entry, flag) for entry, parser in parsers.items() for flag in _path_flags(parser)}
    cased = set(_CLI_CASES) | {(name, flag) for name, flag in found if flag in _script_outputs(name)}
    unknown = found - cased - set(NOT_OUTPUTS)
    assert not unknown, f"path flags with neither a refusal case nor a named exception: {sorted(unknown)}"


# -- the cases: each output flag pointed at an existing file --------------------------------------
def _script_outputs(name: str) -> tuple[str, ...]:
    """A script's output flags: every benchmark's ``--json`` (bench_output.add_json_flag), and more where named."""
    return {"time_to_loss": ("--json", "--plot"), "llm_run": ("--json", "--started-file")}.get(name, ("--json",))


def _existing(tmp_path: Path, name: str = "kept.json") -> Path:
    path = tmp_path / name
    path.write_text('{"kept": true}\n')
    return path


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"devices": [{"name": "a", "tflops": 1.0}, {"name": "b", "tflops": 2.0}]}))
    return spec


def _plots_dir(tmp_path: Path) -> Path:
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "rt_vs_chi.png").write_bytes(b"kept")
    return plots


_CLI_CASES = {
    ("semimig bench", "--json"): lambda t: (["bench", "--json", str(_existing(t)), "--dry-run", "--no-plots"],
                                            t / "kept.json"),
    ("semimig bench", "--plots"): lambda t: (["bench", "--json", str(t / "new.json"), "--dry-run",
                                              "--plots", str(_plots_dir(t))], t / "plots" / "rt_vs_chi.png"),
    ("semimig report", "--json"): lambda t: (["report", str(t / "in.json"), "--json", str(_existing(t)),
                                              "--no-plots"], t / "kept.json"),
    ("semimig report", "--plots"): lambda t: (["report", str(t / "in.json"), "--json", str(t / "new.json"),
                                               "--plots", str(_plots_dir(t))], t / "plots" / "rt_vs_chi.png"),
    ("semimig plan", "--json"): lambda t: (["plan", str(_spec(t)), "--global-batch-size", "4", "--json",
                                            str(_existing(t))], t / "kept.json"),
    ("semimig throttle", "--switch-log"): lambda t: (["throttle", "--rank", "0", "--fraction", "1", "--pattern",
                                                      "1:1", "--switch-log", str(_existing(t)), "--", "true"],
                                                     t / "kept.json"),
}


@pytest.mark.parametrize("case", sorted(_CLI_CASES), ids=lambda c: f"{c[0]} {c[1]}")
def test_a_cli_output_over_an_existing_file_is_refused_naming_overwrite(case, tmp_path, capsys):
    from semimig.cli import main

    argv, kept = _CLI_CASES[case](tmp_path)
    before = kept.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0] and case[1] in err[0], err
    assert kept.read_bytes() == before


@pytest.mark.parametrize("script, flag", [("examples/finetune_llm.py", "--json"), ("benchmarks/llm_run.py", "--json"),
                                          ("benchmarks/llm_run.py", "--started-file")])
def test_the_examples_outputs_over_an_existing_file_are_refused_naming_overwrite(script, flag, tmp_path, capsys):
    example = load_script(script, f"{Path(script).stem}_outputs")
    kept = _existing(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        example.parse_args([flag, str(kept)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "--overwrite" in err[0] and flag in err[0], err
    assert kept.read_text() == '{"kept": true}\n'
    example.parse_args([flag, str(kept), "--overwrite"])  # accepted with it


def _required(parser: argparse.ArgumentParser, skip: str) -> list[str]:
    argv = []
    for action in parser._actions:
        if action.required and action.option_strings and skip not in action.option_strings:
            argv += [action.option_strings[0], str(action.choices[0]) if action.choices else "1"]
    return argv


def test_every_script_output_over_an_existing_file_is_refused_at_parse_time(capture, tmp_path, capsys):
    checked = 0
    for name, parser in _script_parsers(capture).items():
        if name in ("finetune_llm", "llm_run"):
            continue  # its checks run after the parse (test_the_examples_outputs_...)
        for flag in _script_outputs(name):
            if flag not in _path_flags(parser):
                continue
            kept = _existing(tmp_path, f"{name}{flag.strip('-')}.png")
            argv = _required(parser, flag) + [flag, str(kept)]
            with pytest.raises(SystemExit) as exit_info:
                parser.parse_args(argv)
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and "--overwrite" in err and flag in err, (name, flag, err)
            assert kept.read_text() == '{"kept": true}\n'
            checked += 1
    assert checked >= 9


def test_two_outputs_of_one_throttle_command_never_share_a_path(tmp_path, capsys):
    """``semimig throttle --switch-log F -- ... --json F``: the switch log would replace the run's result."""
    from semimig.cli import main

    out = tmp_path / "run.json"
    assert main(["throttle", "--rank", "0", "--fraction", "0.5", "--pattern", "1:1", "--switch-log", str(out), "--",
                 "python", "train.py", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "are one path" in err and "--switch-log" in err and not out.exists()
