"""The package's shape, enforced: a core every lesson builds on, lessons that never import each other,
no import cycle, and an index in ``mnist_helpers/__init__.py`` that names every module."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mnist_helpers"
KINDS = ("lessons", "workers", "tools")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Package modules ``path`` imports (at any depth of the file: lazy imports count too)."""
    found = set()
    pkg_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mnist_helpers")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg_parts[:len(pkg_parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("mnist_helpers"):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
    mods = modules()
    return {m for m in found if m in mods and m != name}


def kind(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in KINDS else "core"


def graph() -> dict[str, set[str]]:
    return {name: imports(path, name) for name, path in modules().items()}


def test_lessons_never_import_each_other():
    bad = [(a, b) for a, deps in graph().items() if kind(a) == "lessons"
           for b in deps if kind(b) == "lessons" and b != "mnist_helpers.lessons"]
    assert not bad, f"a lesson module imports another lesson: {bad}"


def test_core_imports_only_the_core():
    bad = [(a, b) for a, deps in graph().items() if kind(a) == "core" for b in deps if kind(b) != "core"]
    assert not bad, f"a core module imports a lesson, worker or tool: {bad}"


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if m.startswith(n + "."):  # a package importing its own submodule is not a cycle
                continue
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


def test_the_index_names_every_module():
    index = (PKG / "__init__.py").read_text()
    missing = []
    for name, path in modules().items():
        if path.name == "__init__.py" or path.name == "__main__.py":
            continue
        rel = name.split(".", 1)[1]  # data, lessons.l03_dataloader, workers.bugs.oom
        short = rel.split(".")[-1]
        folder = "/".join(rel.split(".")[:-1])
        if not (f"{rel.replace('.', '/')}" in index or (short in index and (not folder or folder in index))):
            missing.append(name)
    assert not missing, f"mnist_helpers/__init__.py does not name: {missing}"
