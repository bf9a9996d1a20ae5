"""What a non-editable install ships: every package of the source tree is listed in setup.py."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _listed_packages() -> set[str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PACKAGES" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("setup.py defines no PACKAGES list")


def test_every_source_package_is_shipped():
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "semimig").rglob("__init__.py")}
    found.add("semimig.kernels")  # the repository folder kernels/ ships under this name
    assert (REPO / "kernels" / "__init__.py").exists()
    assert _listed_packages() == found
