"""The package's shape, enforced: a core every lesson builds on, lessons that never import each other, workers
built on the core alone, no import cycle, no function imported by a string naming it, and an index in
``mnist_helpers/__init__.py`` that names every module."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "mnist_helpers"
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


def test_workers_import_only_the_core():
    """A worker runs under torchrun on a machine that may have only the package: it imports the core and other
    workers (``workers/<group>/common.py``), never a lesson (code it shares with a notebook moves to the core) nor
    a tool. Lazy imports count: ``imports`` walks the whole file."""
    bad = [(a, b) for a, deps in graph().items() if kind(a) == "workers"
           for b in deps if kind(b) not in ("core", "workers")]
    assert not bad, f"a worker imports a lesson or a tool (move what it needs into the core): {bad}"


def test_scripts_import_only_the_core():
    """A script (a benchmark at full size, a generator, device_check) is a program built on the package's core: what it
    shares with a lesson (the lesson's measurement harness) lives in a core module both import (``speedrun``,
    ``scaling``, ``precision``, ``batch_scaling``, ``feeding``), so a lesson stays the notebook's own code."""
    bad = []
    for path in sorted((REPO / "scripts").rglob("*.py")):
        found = imports(path, "scripts." + path.stem)
        bad += [f"{path.relative_to(REPO).as_posix()} imports {m}" for m in sorted(found) if kind(m) != "core"]
    assert not bad, f"a script imports a lesson, worker or tool (move what it needs into the core): {bad}"


# "mnist_helpers.lessons.l07_scaling:ddp_memory": a function named by a string, imported by whoever reads it
BY_STRING = re.compile(r"mnist_helpers\.[a-z0-9_.]+:[a-z_]")
# (file, function) where a test checks the string form on purpose (what run_isolated's child process is given)
STRING_FORM_CHECKED = {("tests/test_memory.py", "test_run_isolated_takes_a_module_level_function_never_a_name")}


def _strings(tree: ast.AST, scope: str = ""):
    """(enclosing function, string literal) for every string constant of ``tree``, docstrings included."""
    for node in ast.iter_child_nodes(tree):
        inner = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield scope, node.value
        yield from _strings(node, inner)


def _sources():
    """(path relative to the repo, Python source) of the package, scripts, tests and notebooks' code cells."""
    for folder in ("mnist_helpers", "scripts", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text()
    for path in sorted((REPO / "notebooks").rglob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                # IPython's %magic and !shell lines are not Python
                yield (f"{path.relative_to(REPO).as_posix()} cell {i}",
                       "\n".join(ln[:len(ln) - len(ln.lstrip())] + "pass" if ln.lstrip().startswith(("%", "!")) else ln
                                 for ln in lines))


def test_no_import_by_string():
    """Functions travel as objects (``run_isolated(l07_scaling.ddp_memory, ...)``), never as "module:function"
    strings that a reader, an IDE and a rename cannot follow: no string literal in the package, scripts, tests or
    notebooks names one, unless a test checks that form on purpose (``STRING_FORM_CHECKED``)."""
    bad = []
    for where, source in _sources():
        for scope, text in _strings(ast.parse(source)):
            if BY_STRING.search(text) and (where, scope) not in STRING_FORM_CHECKED:
                bad.append(f"{where}{' ' + scope if scope else ''}: {BY_STRING.search(text).group(0)}...")
    for path in sorted((REPO / "scripts").rglob("*")):
        if path.is_file() and path.suffix in (".sh", ".sbatch", ".yaml", ".yml") and BY_STRING.search(path.read_text()):
            bad.append(f"{path.relative_to(REPO).as_posix()}: {BY_STRING.search(path.read_text()).group(0)}...")
    assert not bad, f"a function named by a string (pass the function itself): {bad}"


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


def named(name: str, text: str) -> bool:
    """``name`` stands in ``text`` as itself: ``batch_scaling`` is not named by ``lessons/l04_batch_scaling``."""
    return re.search(rf"(?<![\w/]){re.escape(name)}\b", text) is not None


def test_the_index_names_every_module():
    index = (PKG / "__init__.py").read_text()
    missing = []
    for name, path in modules().items():
        if path.name == "__init__.py" or path.name == "__main__.py":
            continue
        rel = name.split(".", 1)[1]  # data, lessons.l03_dataloader, workers.bugs.oom
        short = rel.split(".")[-1]
        folder = "/".join(rel.split(".")[:-1])
        if not (named(rel.replace(".", "/"), index) or (named(short, index) and (not folder or folder in index))):
            missing.append(name)
    assert not missing, f"mnist_helpers/__init__.py does not name: {missing}"
