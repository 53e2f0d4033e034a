"""The import graph of rpevit, read from the source (ast): which module imports which, and how.

An edge is TOP (at module level: it runs when the module is imported), DEFERRED (inside a function)
or TYPING (under `if TYPE_CHECKING:`, never at run time); PLUGIN edges are registry.load_all's
imports of every module of the plugin packages, by name at run time (registering is the only wiring).
Importing `a.b.c` also runs the packages `a` and `a.b`; an edge to one's own package is not counted.

    python -m tests.import_graph    # the cycles, and every edge between rpevit modules
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP, DEFERRED, TYPING, PLUGIN = "top", "deferred", "typing", "plugin"
PLUGIN_PACKAGES = ("rpevit.attention", "rpevit.pe", "rpevit.tasks")  # registry.load_all


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / "rpevit").rglob("*.py"))}


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (`from pkg import mod` names pkg and pkg.mod)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules()]
    return []


@functools.lru_cache(maxsize=1)
def edges() -> dict[str, dict[str, frozenset[str]]]:
    """module -> {imported module (rpevit's, or an outside package's full name) -> the kinds of the edge}."""
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in modules().items():
        out: dict[str, set[str]] = graph.setdefault(name, {})

        def visit(node: ast.AST, kind: str) -> None:
            for child in ast.iter_child_nodes(node):
                child_kind = kind
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and kind == TOP:
                    child_kind = DEFERRED
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    visit(ast.Module(body=child.body, type_ignores=[]), TYPING)
                    visit(ast.Module(body=child.orelse, type_ignores=[]), child_kind)
                    continue
                for target in _imported(child):
                    if target != name and not name.startswith(target + "."):
                        out.setdefault(target, set()).add(child_kind)
                visit(child, child_kind)

        visit(ast.parse(path.read_text()), TOP)
    for target in modules():
        if target.startswith(tuple(p + "." for p in PLUGIN_PACKAGES)):
            graph["rpevit.registry"].setdefault(target, set()).add(PLUGIN)
    return {m: {t: frozenset(k) for t, k in out.items()} for m, out in graph.items()}


def _with_packages(target: str) -> list[str]:
    """`a.b.c` and the packages importing it runs first (a, a.b) that are rpevit modules."""
    parts = target.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules()]


def closure(roots: tuple[str, ...], kinds: frozenset[str] = frozenset({TOP})) -> set[str]:
    """Every module importing `roots` runs through edges of `kinds`: rpevit's, and the outside ones by full name."""
    seen: set[str] = set()
    todo = [m for root in roots for m in _with_packages(root)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target, how in edges().get(name, {}).items():
            if how & kinds:
                todo += _with_packages(target) if target.startswith("rpevit") else [target]
    return seen


def cycles(kinds: frozenset[str] = frozenset({TOP, DEFERRED, TYPING})) -> list[list[str]]:
    """The strongly connected components of more than one rpevit module over edges of `kinds` (Tarjan)."""
    graph = {m: sorted(t for t, how in out.items() if how & kinds and t in modules()) for m, out in edges().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return found


def main() -> None:
    print(f"cycles (top, deferred and typing edges): {cycles() or 'none'}")
    for name, out in sorted(edges().items()):
        for target, how in sorted(out.items()):
            if target.startswith("rpevit"):
                print(f"{name} -> {target} ({', '.join(sorted(how))})")


if __name__ == "__main__":
    main()
