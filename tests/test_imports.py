"""engine/ and ui/ import one way: no module reaches itself through its imports, counting the imports inside
functions too (a function-level import that closes a circle only hides it). Read statically with ast, so the
check costs no torch import and sees every branch."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "ui")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of PACKAGES (a package is its __init__.py)."""
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that the module imports anywhere in its body; `from pkg import sub` counts as
    importing pkg.sub where that is a module, else pkg itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as a sorted list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("extra", [{"ui.render": {"ui.plots"}}, {"engine.sampling": {"engine.request"}}])
def test_a_circle_is_found(extra):
    # the check can fail: one import back up the layers closes a circle
    edges = graph()
    for m, targets in extra.items():
        edges[m] = edges[m] | targets
    assert circles(edges)


def test_the_function_level_imports_count():
    edges = graph()
    # ui/profile.py imports ui.startup at the top, ui.runtime imports engine.weights inside functions
    assert "ui.startup" in edges["ui.profile"] and "engine.weights" in edges["ui.runtime"]
