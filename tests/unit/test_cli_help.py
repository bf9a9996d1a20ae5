"""``semimig --help`` and every command's ``--help`` read as plain words: no reStructuredText
markup (double backticks, roles such as :class:) from the docstrings they are built from."""
import re

import pytest

from test_fuzz_cli import run_cli

MARKUP = re.compile(r"``|`|:(class|func|mod|meth|data|attr|obj|ref):")


@pytest.mark.parametrize("argv", [[], ["demo"], ["bench"], ["report"], ["plan"], ["throttle"], ["cluster"]],
                         ids=lambda a: " ".join(a) or "semimig")
def test_help_has_no_markup(argv):
    code, out, err = run_cli([*argv, "--help"])
    assert code == 0, err
    assert out.strip() and not MARKUP.search(out), [line for line in out.splitlines() if MARKUP.search(line)]


def test_plain_keeps_the_words():
    from semimig.cli import plain

    assert plain("``semimig bench``: see :class:`~semimig.BalanceConfig` and :func:`semimig.enable`") == \
        "semimig bench: see BalanceConfig and semimig.enable"
