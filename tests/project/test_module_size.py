"""House rule: no module over 600 lines without a reason written at its top.

A module longer than that must say why it is one module: a line in its docstring that starts with
`Size: `. Without one, split it along its responsibilities (as agent/reporting/ and
remediations/policy/ were).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("agent", "detectors", "remediations", "udal", "reports", "rules", "trainmedic")
MAX_LINES = 600


def long_modules(root: Path, max_lines: int = MAX_LINES) -> list[Path]:
    """The .py files under the folders longer than `max_lines` (links, such as trainmedic/agent, not followed)."""
    found = []
    for folder in FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root)
            if any((root / part).is_symlink() for part in (rel, *rel.parents)):
                continue
            if len(path.read_text(encoding="utf-8").splitlines()) > max_lines:
                found.append(path)
    return found


def size_reason(path: Path) -> str | None:
    """The `Size: ` line of the module's docstring, or None."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    for line in doc.splitlines():
        if line.startswith("Size: ") and line[len("Size: ") :].strip():
            return line
    return None


@pytest.mark.parametrize("path", long_modules(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why_it_is_one(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert size_reason(path), (
        f"{path.relative_to(ROOT)} has {lines} lines: split it, or give the reason it is one module in a "
        f"`Size: ` line of its docstring"
    )


def test_the_check_finds_a_long_module_without_a_reason(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    long = tmp_path / "agent" / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * MAX_LINES, encoding="utf-8")
    reasoned = tmp_path / "agent" / "reasoned.py"
    reasoned.write_text('"""A module.\n\nSize: one parser.\n"""\n' + "x = 1\n" * MAX_LINES, encoding="utf-8")
    short = tmp_path / "agent" / "short.py"
    short.write_text('"""A module."""\n' + "x = 1\n" * (MAX_LINES - 1), encoding="utf-8")
    assert long_modules(tmp_path) == [long, reasoned]
    assert size_reason(long) is None
    assert size_reason(reasoned) == "Size: one parser."
