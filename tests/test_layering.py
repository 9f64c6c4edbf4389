"""Imports only run down the layers (docs/design.md, "Layers"); no module is over 600 lines.

A module may import gyre modules of its own layer or of a lower one, never of a higher one; the
walk reads every import statement of `gyre/` (function-level and `TYPE_CHECKING` ones included)
with `ast`, so a back-running import cannot hide in a function body.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gyre

ROOT = Path(gyre.__file__).parent

LAYERS: list[tuple[str, ...]] = [
    ("gyre.errors", "gyre._lazy", "gyre._asgi", "gyre._mailbox", "gyre._heap", "gyre._counters"),
    ("gyre.config",),
    ("gyre.kernels",),
    ("gyre.engines",),
    ("gyre.tito",),
    ("gyre.trajectory",),
    ("gyre.rl",),
    ("gyre.sandbox",),
    ("gyre.tasks",),
    ("gyre.agents",),
    ("gyre.model",),
    ("gyre.cell",),
    ("gyre.routing",),
    ("gyre.rollout",),
    ("gyre.runtime",),
    ("gyre.report",),
    ("gyre.sim",),
    ("gyre.gateway", "gyre.job", "gyre.node", "gyre.__main__", "gyre"),
]
"""Lowest first. A name matches a module and everything under it (`gyre.tito` holds
`gyre.tito.proxy`); `gyre` alone is the package's own `__init__`."""


def layer_of(module: str) -> int:
    """The index in `LAYERS` of `module` (a dotted gyre module name); ValueError for none."""
    best, best_len = None, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if name == "gyre":
                hit = module == "gyre"
            else:
                hit = module == name or module.startswith(name + ".")
            if hit and len(name) > best_len:
                best, best_len = index, len(name)
    if best is None:
        raise ValueError(f"{module} is in no layer of tests/test_layering.py's LAYERS")
    return best


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def gyre_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, imported gyre module) for every import statement in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "gyre"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "gyre":
                continue
            if target == "gyre":  # `from gyre import x`: x may be a subpackage
                found += [(node.lineno, f"gyre.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return sorted(found)


def violations(root: Path = ROOT) -> list[str]:
    """One line per back-running import under `root` (a `gyre` package folder)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = module_name(path, root)
        own = layer_of(here)
        for line, target in gyre_imports(path, root):
            if layer_of(target) > own:
                bad.append(f"{path.relative_to(root.parent)}:{line}: {here} imports {target}")
    return bad


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the gyre modules it imports (every import statement, as `gyre_imports` reads
    them; `from package import module` names the module, and a package stands for its
    `__init__`). A module's own enclosing packages are left out: Python runs them first, so a
    submodule that imports its package's face closes no circle."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        here = module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {
            f"{node.module}.{a.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            for a in node.names
        }
        targets = {t for _, t in gyre_imports(path, root)}
        ancestors = {here.rsplit(".", k)[0] for k in range(1, here.count(".") + 1)}
        graph[here] = {t for t in targets | names if t in modules and t != here} - ancestors
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    """No group of modules imports itself round, not even through a function-level import."""
    graph = import_graph()
    assert circles(graph) == []
    assert len(graph) > 150 and sum(map(len, graph.values())) > 300  # the walk saw the imports


def test_circles_finds_a_hidden_circle() -> None:
    """The checker itself, on a hand-written graph: a -> b -> c -> a (as the rollout circle of
    1a3689b ran through a function-level import) and a lone self-free chain d -> e."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"d": {"e"}, "e": set()}) == []


def test_every_module_has_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        layer_of(module_name(path))


def test_imports_only_run_down_the_layers() -> None:
    assert violations() == []


MAX_LINES = 600
"""docs/style.md rule 15: a longer module holds more than one concept."""


def test_no_module_is_over_600_lines() -> None:
    sizes = {
        p.relative_to(ROOT.parent): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")
    }
    assert {str(p): n for p, n in sizes.items() if n > MAX_LINES} == {}
    assert max(sizes.values()) > 400  # the walk saw the package's big modules


def test_the_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: a back-running import inside a function is found (independent check
    on a hand-written file, not on gyre's tree)."""
    root = tmp_path / "gyre"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text(
        "from . import probe\nfrom ..runtime import job\n"
    )
    (root / "kernels" / "probe.py").write_text(
        "def f():\n    from gyre.runtime import job\n\n"
        "import os\nfrom gyre.errors import GyreError\n"
    )
    assert gyre_imports(root / "kernels" / "probe.py", root) == [
        (2, "gyre.runtime"),
        (5, "gyre.errors"),
    ]
    assert violations(root) == [
        "gyre/kernels/__init__.py:2: gyre.kernels imports gyre.runtime",
        "gyre/kernels/probe.py:2: gyre.kernels.probe imports gyre.runtime",
    ]
    assert layer_of("gyre.tito.proxy") == layer_of("gyre.tito") < layer_of("gyre.runtime.job")
