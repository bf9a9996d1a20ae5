"""A results file that is not a ``semimig bench`` result — deeply nested, truncated, the wrong
shape — is refused in one line naming the file, by ``bench --resume`` and by ``report``, before
any training: never a traceback."""
import pytest

from test_fuzz_cli import run_cli

NESTED = "[" * 100_000 + "]" * 100_000  # deeper than json's recursive decoder can go


@pytest.mark.parametrize("text", [NESTED, '{"records": [], "config": ' + NESTED + "}", '{"records": [',
                                  '{"records": [], "config": []}', "[]"],
                         ids=["nested", "nested-config", "truncated", "config-a-list", "a-list"])
@pytest.mark.parametrize("argv", [["bench", "--resume", "--dry-run", "--json"], ["report"]], ids=["resume", "report"])
def test_a_malformed_results_file_is_refused_in_one_line_naming_it(tmp_path, text, argv):
    path = tmp_path / "r.json"
    path.write_text(text)
    command = argv[0]
    code, _, err = run_cli([*argv, str(path)] + (["--json", str(tmp_path / "out.json")] if command == "report" else []))
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and lines[0].startswith(f"semimig {command}: error: "), err
    assert str(path) in lines[0] and "Traceback" not in err


def test_the_resume_refusal_names_the_way_out(tmp_path):
    from semimig.bench.results import ResultsFile
    from semimig.errors import ConfigError

    path = tmp_path / "r.json"
    path.write_text(NESTED)
    with pytest.raises(ConfigError, match=r"r\.json exists and nests too deeply.*--overwrite"):
        ResultsFile.open(path, {"modes": ["baseline"]}, machine={}, resume=True, overwrite=False)
    assert ResultsFile.open(path, {"modes": ["baseline"]}, machine={}, resume=False, overwrite=True).records == []
