"""The package's import graph has no cycle, counting function-level (lazy) imports as edges too.

Every module under ``gspo_bench/`` is parsed with ``ast`` (nothing is
imported). Each ``import gspo_bench.x`` / ``from gspo_bench.x import y`` /
relative ``from .x import y``, at module level or inside a function, class or
``if``, is an edge from the importing module to the module it names:
``from gspo_bench.x import y`` goes to ``gspo_bench.x.y`` when ``y`` is a
submodule (a file or a package), else to ``gspo_bench.x`` (its
``__init__``). A lazy import is an edge like any other: it only defers the
cycle to the first call, where it shows as a half-initialised module.

Two rules, both so that the graph says what Python actually imports:

* An import names one module; the parent packages Python initialises first
  (``gspo_bench.tasks`` before ``gspo_bench.tasks.task``) are not added as
  edges. Python runs a package's ``__init__`` before any of its submodules,
  so ``tasks/task.py`` importing its sibling ``tasks/generators.py`` while
  ``tasks/__init__.py`` imports both is no cycle; with implicit parent edges
  every package whose ``__init__`` re-exports a submodule would be one.
  An import that names a package (``from gspo_bench import algorithms``,
  ``from gspo_bench.tasks import Task``) is an edge to its ``__init__``.
* A package ``__init__`` that imports its submodules dynamically
  (``pkgutil.iter_modules(__path__)`` with ``importlib.import_module``, as
  ``algorithms/__init__.py`` does to register every algorithm file) gets an
  edge to each of its submodules, which ``ast`` alone would not see.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "gspo_bench"
ROOT = Path(__file__).resolve().parent.parent / PKG


def module_name(path: Path) -> str:
    parts = [PKG, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports_submodules_dynamically(tree: ast.AST) -> bool:
    """``for _ in pkgutil.iter_modules(__path__): importlib.import_module(...)``."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return (any(c.func.attr == "iter_modules" and any(isinstance(a, ast.Name) and a.id == "__path__" for a in c.args)
                for c in calls)
            and any(c.func.attr == "import_module" for c in calls))


def import_graph(mods: dict[str, Path] | None = None) -> dict[str, dict[str, list[str]]]:
    """``graph[a][b]`` = where ``a`` imports ``b`` (``file:line``, ``(lazy)`` when inside a function)."""
    mods = modules() if mods is None else mods
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in mods}

    def add(src: str, dst: str, where: str) -> None:
        if dst in mods and dst != src and where not in graph[src].get(dst, []):
            graph[src].setdefault(dst, []).append(where)

    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        # the package a relative import is relative to
        package = name if _is_package(path) else name.rpartition(".")[0]
        lazy_lines = {n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            rel = path.relative_to(ROOT.parent)
            where = f"{rel}:{node.lineno}" + (" (lazy)" if node.lineno in lazy_lines else "")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(name, alias.name, where)
                continue
            if node.level:  # from . import x / from .x import y
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != PKG and not target.startswith(PKG + "."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(name, sub if sub in mods else target, where)
        if _is_package(path) and _imports_submodules_dynamically(tree):
            for other in mods:
                if other.rpartition(".")[0] == name:
                    add(name, other, f"{path.relative_to(ROOT.parent)} (pkgutil.iter_modules + import_module)")
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (iterative DFS, three colours)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph}
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = GREY
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = BLACK
                stack.pop()
                path.pop()
            elif colour[child] == GREY:
                return path[path.index(child):] + [child]
            elif colour[child] == WHITE:
                colour[child] = GREY
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[set[str]]:
    """Components of mutually importing modules (Kosaraju); only those of two or more modules."""
    order, seen = [], set()
    for start in sorted(graph):
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                order.append(node)
                stack.pop()
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(sorted(graph[child]))))
    reverse: dict[str, set[str]] = {m: set() for m in graph}
    for a, bs in graph.items():
        for b in bs:
            reverse[b].add(a)
    comps, done = [], set()
    for start in reversed(order):
        if start in done:
            continue
        comp, todo = set(), [start]
        done.add(start)
        while todo:
            node = todo.pop()
            comp.add(node)
            for b in reverse[node] - done:
                done.add(b)
                todo.append(b)
        if len(comp) > 1:
            comps.append(comp)
    return comps


def all_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """One cycle per group of mutually importing modules."""
    return [find_cycle({a: {b: w for b, w in graph[a].items() if b in comp} for a in comp})
            for comp in strongly_connected(graph)]


def describe(graph: dict[str, dict[str, list[str]]], cycle: list[str]) -> str:
    return "\n".join(f"  {a} -> {b}  [{'; '.join(graph[a][b])}]" for a, b in zip(cycle, cycle[1:]))


def test_the_parser_sees_top_level_lazy_relative_and_dynamic_imports():
    g = import_graph()
    assert "gspo_bench.rollout.engine" in g["gspo_bench.config.sections"]  # top level, from x.y import Name
    assert "gspo_bench.config.sections" in g["gspo_bench.config"]  # a package __init__ re-exporting
    assert "gspo_bench.paths" in g["gspo_bench.config.loading"]  # inside a function
    assert "gspo_bench.rollout.fastlm" in g["gspo_bench.rollout.engine"]  # from package import submodule
    assert "gspo_bench.algorithms" in g["gspo_bench.runner"]  # from gspo_bench import algorithms (a package)
    assert "gspo_bench" in g["gspo_bench.runner"]  # from gspo_bench import __version__
    assert "gspo_bench.algorithms.gspo" in g["gspo_bench.algorithms"]  # pkgutil.iter_modules + import_module
    assert g["gspo_bench.config.loading"]["gspo_bench.paths"][0].endswith("(lazy)")


def test_find_cycle_reports_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {}}) is None
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"b2": []}, "b2": {"b": []}}) == ["b", "b2", "b"]
    two = {"a": {"b": []}, "b": {"a": [], "c": []}, "c": {"d": []}, "d": {"c": []}, "e": {"a": []}}
    assert all_cycles(two) in ([["a", "b", "a"], ["c", "d", "c"]], [["c", "d", "c"], ["a", "b", "a"]])


def test_relative_imports_resolve(tmp_path, monkeypatch):
    pkg = tmp_path / PKG
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("from .b import x\nfrom .. import low\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from gspo_bench.sub.a import y\n")
    monkeypatch.setattr(f"{__name__}.ROOT", pkg)
    g = import_graph()
    assert g["gspo_bench.sub"] == {"gspo_bench.sub.a": ["gspo_bench/sub/__init__.py:1"]}
    assert set(g["gspo_bench.sub.a"]) == {"gspo_bench.sub.b", "gspo_bench.low"}
    assert find_cycle(g) == ["gspo_bench.sub.a", "gspo_bench.sub.b", "gspo_bench.sub.a"]


def test_gspo_bench_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and sum(map(len, graph.values())) > 50  # the walk found the package
    cycles = all_cycles(graph)
    text = "\n".join(f"import cycle {i + 1}:\n{describe(graph, c)}" for i, c in enumerate(cycles))
    if cycles:
        print(text)
    assert not cycles, f"{len(cycles)} import cycle(s), lazy imports count:\n{text}"
