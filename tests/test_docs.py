"""Contracts apart from lab notes (docs/style.md rule 2; docs/notes/README.md).

Module docstrings are contracts of at most 25 lines; every repository path named in gyre's code,
the docs, the README and the benchmarks exists, and none names `shared/` (notes beside a checkout,
which a clone does not have); the README is a user guide of at most 160 lines with no commit hash;
docs/design.md holds no dated measurement. Each checker also runs on a hand-made case that fails.

What counts as a reference: a token that starts with one of the repository's top-level folders
(`docs/`, `gyre/`, `tests/`, `benchmarks/`, `examples/`, `.ci/`), is not glued to a path character
before it (`/`, `.`, a letter, `<`, `-`), and ends in a file name with an extension or in a folder
(a trailing `/`). So `runs/cpu/...` (no such folder in the repository), `<run_dir>/gateway.json`,
`<task>/tests/test.sh`, `/work/...`, the route `/gyre/v1/executions`, another project's file
written under its name (`httpx/tests/...`) and a ratio such as `gyre/direct` are not references.
A token holding a placeholder (`<name>`, `*`, `{`, `...`) is a pattern, not a reference. Trailing
punctuation (`.`, `,`, `:`, `)`) ends a token. `TASK_PATHS` lists the few paths inside a task
folder (its own `tests/`) that gyre's task code names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gyre

REPO = Path(gyre.__file__).parent.parent
MAX_DOCSTRING_LINES = 25
MAX_README_LINES = 160
TOP_FOLDERS = ("docs", "gyre", "tests", "benchmarks", "examples", ".ci")

TASK_PATHS = {
    "tests/test.sh": "a task's script verifier (gyre/tasks/task.py)",
    "tests/test_a.py": "a pytest node ID of a task's tests (gyre/tasks/scorer.py)",
}
"""Paths relative to a task folder, not to the repository: name -> where and why."""

_REFERENCE = re.compile(
    r"(?<![\w/.<>-])(?:" + "|".join(re.escape(t) for t in TOP_FOLDERS) + r")/[\w./<>*{}-]*"
)
_SHARED = re.compile(r"(?<![\w.-])(?:\.\./)?shared/")
_BARE_NOTE = re.compile(r"(?<![\w/.-])notes/[\w.-]+\.md")
"""A note named without its folder (`notes/x.md`): the repository's notes are `docs/notes/`."""
_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_DATE = re.compile(r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])\b")


def docstring_lines(source: str) -> int | None:
    """How many source lines the module's opening docstring spans (its quotes included); None
    for a module without one."""
    body = ast.parse(source).body
    if not body or not isinstance(body[0], ast.Expr):
        return None
    node = body[0].value
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return None
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def long_docstrings(root: Path) -> dict[str, int | None]:
    """Module -> its docstring's length, for every module under `root` (a package folder) whose
    docstring is missing (None) or over `MAX_DOCSTRING_LINES`."""
    found: dict[str, int | None] = {}
    for path in sorted(root.rglob("*.py")):
        n = docstring_lines(path.read_text())
        if n is None or n > MAX_DOCSTRING_LINES:
            found[str(path.relative_to(root.parent))] = n
    return found


def references(text: str) -> list[str]:
    """The repository paths `text` names (the module docstring says what counts)."""
    found = []
    for match in _REFERENCE.finditer(text):
        token = match.group().rstrip(".,:)")
        if any(c in token for c in "<>*{}") or "..." in token:
            continue
        if not (token.endswith("/") or "." in token.rsplit("/", 1)[1]):
            continue
        found.append(token)
    return found


def broken_references(text: str, repo: Path) -> list[str]:
    """The references in `text` that do not exist under `repo`, every `shared/` one and every
    note named without `docs/`."""
    bad = [r for r in references(text) if r not in TASK_PATHS and not (repo / r).exists()]
    return bad + [m.group() for m in (*_SHARED.finditer(text), *_BARE_NOTE.finditer(text))]


def checked_files(repo: Path) -> list[Path]:
    """gyre/**/*.py, docs/**/*.md, README.md, benchmarks/*.py, the example configs and notes (not
    the generated task suites), the Makefile and pyproject.toml. Tests are left out: they write
    task folders and mounts of their own, whose paths are not the repository's."""
    return [
        *sorted((repo / "gyre").rglob("*.py")),
        *sorted((repo / "docs").rglob("*.md")),
        repo / "README.md",
        *sorted((repo / "benchmarks").glob("*.py")),
        *sorted((repo / "examples").glob("*.toml")),
        *sorted((repo / "examples" / "sim").iterdir()),
        repo / "examples" / "tasks" / "README.md",
        repo / "Makefile",
        repo / "pyproject.toml",
    ]


def commit_hashes(text: str) -> list[str]:
    """Runs of 7-40 lower-case hex digits, whole words, with at least one digit and one letter:
    so neither an ordinary word (`defaced`) nor a number (`1234567`)."""
    return [
        h for h in _HEX.findall(text) if any(c.isdigit() for c in h) and any(c.isalpha() for c in h)
    ]


def dates(text: str) -> list[str]:
    """Year-month dates (`2026-12`, `2026-12-07`): a dated measurement's mark."""
    return _DATE.findall(text)


def test_every_module_docstring_is_a_contract_of_at_most_25_lines() -> None:
    assert long_docstrings(REPO / "gyre") == {}


def test_long_docstrings_finds_a_long_or_missing_one(tmp_path: Path) -> None:
    root = tmp_path / "gyre"
    root.mkdir()
    (root / "short.py").write_text('"""One line."""\n\nx = 1\n')
    (root / "cap.py").write_text('"""' + "line\n" * 24 + '"""\n')
    (root / "long.py").write_text('"""' + "line\n" * 25 + '"""\n')
    (root / "none.py").write_text("x = '''not a docstring'''\n")
    assert docstring_lines((root / "cap.py").read_text()) == 25
    assert long_docstrings(root) == {"gyre/long.py": 26, "gyre/none.py": None}


def test_every_repository_path_named_in_code_and_docs_exists() -> None:
    bad = {}
    for path in checked_files(REPO):
        if found := broken_references(path.read_text(), REPO):
            bad[str(path.relative_to(REPO))] = found
    assert bad == {}
    named = [ref for path in checked_files(REPO) for ref in references(path.read_text())]
    assert len(named) > 200  # the walk saw the references


def test_broken_references_finds_a_missing_path_and_shared_notes(tmp_path: Path) -> None:
    (tmp_path / "docs" / "notes").mkdir(parents=True)
    (tmp_path / "docs" / "notes" / "here.md").write_text("")
    outside = "sha" + "red"  # the folder beside a checkout, spelled so this file names none of it
    text = (
        "See `docs/notes/here.md`, docs/notes/ and `docs/notes/gone.md`.\n"
        "Patterns: `docs/notes/<topic>.md`, `benchmarks/bench_<name>.py`, gyre/**/*.py.\n"
        "Run-time paths: runs/cpu/report/, `<run_dir>/gateway.json`, /work/gyre/x.py,\n"
        "POST /gyre/v1/executions, results/main_job.json, gyre.cell.server, gyre/direct 1.02,\n"
        "`<task>/tests/test.sh`, httpx/tests/test_exported_members.py, tests/test_a.py::T.\n"
        f"Notes beside the checkout: {outside}/notes/cell-serving.md and ../{outside}/x.\n"
        "A note without its folder: notes/anchors.md; with it: docs/notes/here.md.\n"
    )
    assert references(text) == [
        "docs/notes/here.md",
        "docs/notes/",
        "docs/notes/gone.md",
        "tests/test_a.py",
        "docs/notes/here.md",
    ]
    assert broken_references(text, tmp_path) == [
        "docs/notes/gone.md",
        f"{outside}/",
        f"../{outside}/",
        "notes/anchors.md",
    ]


def test_readme_is_a_user_guide_of_at_most_160_lines_without_commit_hashes() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert commit_hashes(text) == []


def test_commit_hashes_finds_a_hash_and_no_word_or_number() -> None:
    text = "measured at 9d0d515 (was b51fd1a); defaced 1234567 3e-4 5.7e-7 sha 0123456789abcdef0"
    assert commit_hashes(text) == ["9d0d515", "b51fd1a", "0123456789abcdef0"]
    assert commit_hashes("a decade of feedback, 20261207, cafe, abcdef1") == ["abcdef1"]


def test_design_doc_holds_no_dated_measurement() -> None:
    assert dates((REPO / "docs" / "design.md").read_text()) == []


def test_dates_finds_a_dated_measurement() -> None:
    assert dates("measured 2026-12-07 and in 2025-01; not 3e-4, 1-2 or 2026") == [
        "2026-12",
        "2025-01",
    ]
