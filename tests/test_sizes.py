"""Size is a tested property (as in tinygrad): no source file over 500 lines, no function over
70 lines, a README a user can read (at most 250 lines; measurement logs live in
benchmarks/README.md, design notes in docs/)."""
from __future__ import annotations

import ast
from pathlib import Path

import torq

SRC = Path(torq.__file__).parent
ROOT = SRC.parent.parent
MAX_FILE, MAX_FUNCTION, MAX_README = 500, 70, 250


def too_long(path: Path) -> list[str]:
    """'path: N lines' and 'path:LINE name: N lines' for what breaks the budget."""
    text = path.read_text()
    out = [f"{path.name}: {text.count(chr(10))} lines"] if text.count("\n") > MAX_FILE else []
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION:
            out.append(f"{path.name}:{n.lineno} {n.name}: {n.end_lineno - n.lineno + 1} lines")
    return out


def test_source_files_and_functions_are_short():
    bad = [f"{p.relative_to(SRC)}: {b}" for p in sorted(SRC.rglob("*.py")) for b in too_long(p)]
    assert not bad


def test_the_budget_sees_a_long_function(tmp_path):
    """Positive control: a 71-line function and a 501-line file are reported."""
    f = tmp_path / "long.py"
    f.write_text("def f():\n" + "    x = 1\n" * 70 + "\n" * 430)
    assert too_long(f) == ["long.py: 501 lines", "long.py:1 f: 71 lines"]


def test_readme_is_a_users_document():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= MAX_README, f"README.md has {lines} lines; move detail to docs/ or benchmarks/README.md"


def test_doc_links_resolve():
    """Every relative link of the README, docs/ and benchmarks/README.md points at a file."""
    import re
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [f"{d.relative_to(ROOT)}: {t}" for d in docs
               for t in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", d.read_text()) if not (d.parent / t).exists()]
    assert not missing
