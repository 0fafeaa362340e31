"""The package's shape, enforced: four layers (foundation, course, lessons, workers) with nothing importing upward,
a foundation that stays small, no import cycle, no function imported by a string naming it, and a map in
docs/MAINTAINING.md that names every module."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "mnist_helpers"


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


# the layers, bottom first: a module imports its own layer or a lower one, never a higher one
LAYERS = ("foundation", "course", "lessons", "workers")
FOUNDATION_MAX_LINES = 3500


def layer(name: str) -> str:
    """``foundation`` (the flat ``mnist_helpers.<module>``), ``course``, ``lessons`` or ``workers``."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else "foundation"


def notebook_of(name: str) -> int | None:
    """12 for ``mnist_helpers.lessons.n12.lesson`` and the package ``mnist_helpers.lessons.n12``; else None."""
    m = re.match(r"mnist_helpers\.lessons\.n(\d\d)\b", name)
    return int(m.group(1)) if m else None


def graph() -> dict[str, set[str]]:
    return {name: imports(path, name) for name, path in modules().items()}


def upward(a: str, b: str) -> str | None:
    """Why ``a`` importing ``b`` goes upward, or None when it may."""
    if LAYERS.index(layer(b)) > LAYERS.index(layer(a)):
        return f"{layer(a)} imports {layer(b)}"
    if layer(a) == layer(b) == "lessons" and (notebook_of(b) or 0) > (notebook_of(a) or 0):
        return "a lesson imports a later notebook's lesson"
    if layer(a) == "workers" and b.endswith(".lesson"):
        return "a worker imports a notebook's lesson module (only its measurement code may be shared)"
    return None


def test_nothing_imports_upward():
    """foundation < course < lessons < workers. The foundation is what notebooks, workers and scripts share; the
    course (the series machinery: claims framework, exercises, registry, generators, hosted bootstrap) builds on it;
    each notebook's lesson package ``lessons/nNN`` builds on both and may import an earlier notebook's package by name
    (08 runs 05's batch-size finder); a worker may import a lesson package's measurement code, never a ``lesson``
    module. Lazy imports count: ``imports`` walks the whole file."""
    bad = [f"{a} -> {b}: {why}" for a, deps in graph().items() for b in sorted(deps) if (why := upward(a, b))]
    assert not bad, "imports that go upward:\n" + "\n".join(bad)


def test_scripts_import_no_lesson_module_and_no_worker():
    """A script (a benchmark at full size, a generator, device_check) builds on the foundation, the course and the
    measurement code of a lesson package (``lessons.n07.scaling``), never on a notebook's ``lesson`` module (the
    notebook's own code, widgets included) nor a worker (it launches workers by name)."""
    bad = []
    for path in sorted((REPO / "scripts").rglob("*.py")):
        found = imports(path, "scripts." + path.stem)
        bad += [f"{path.relative_to(REPO).as_posix()} imports {m}" for m in sorted(found)
                if m.endswith(".lesson") or layer(m) == "workers"]
    assert not bad, f"a script imports a lesson module or a worker: {bad}"


def test_the_foundation_stays_small():
    """The foundation is the part every reader needs; notebook-specific code lives in its lesson package."""
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()
             if layer(name) == "foundation"}
    assert sum(lines.values()) <= FOUNDATION_MAX_LINES, (
        f"the foundation has {sum(lines.values())} lines (at most {FOUNDATION_MAX_LINES}): move notebook-specific "
        f"code into its lesson package; by module: {sorted(lines.items(), key=lambda kv: -kv[1])}")


# "mnist_helpers.lessons.n07.lesson:ddp_memory": a function named by a string, imported by whoever reads it
BY_STRING = re.compile(r"mnist_helpers\.[a-z0-9_.]+:[a-z_]")
# (file, function) where a test checks the string form on purpose (what run_isolated's child process is given)
STRING_FORM_CHECKED = {("tests/core/test_memory.py", "test_run_isolated_takes_a_module_level_function_never_a_name")}


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
    """Functions travel as objects (``run_isolated(l07.ddp_memory, ...)``), never as "module:function"
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


def test_the_map_names_every_module():
    """docs/MAINTAINING.md's "The package" names every module, each in the row of its folder."""
    text = (REPO / "docs" / "MAINTAINING.md").read_text()
    section = text.split("## The package", 1)[1].split("\n## ", 1)[0]
    missing = []
    for name, path in modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = name.split(".", 1)[1]  # data, course.claims, lessons.n03.feeding, workers.bugs.oom
        short, folder = rel.split(".")[-1], "/".join(rel.split(".")[:-1])
        rows = [ln for ln in section.splitlines() if ln.startswith("|")]
        if not folder:
            ok = any(ln.startswith(f"| `{short}` |") for ln in rows)
        elif folder == "course":
            ok = any(ln.startswith(f"| `course/{short}` |") for ln in rows)
        else:
            ok = any(f"`{folder}`" in ln and f"`{short}`" in ln for ln in rows)
        if not ok:
            missing.append(name)
    assert not missing, f"docs/MAINTAINING.md's map (The package) does not name: {missing}"


TEST_AREAS = ("core", "course", "notebooks", "workers", "system")


def test_tests_live_by_area():
    """tests/<area>/test_<subject>.py: the foundation's tests in core/, the machinery's in course/, each notebook's in
    notebooks/ (test_nNN_<topic>.py, or test_all_<topic>.py for every notebook), the workers' in workers/, and what
    holds for the whole repository or a platform in system/. Support files (conftest.py, notebook_runs.py, the
    workers tests launch) stay at tests/."""
    bad = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        rel = path.relative_to(REPO / "tests")
        if len(rel.parts) != 2 or rel.parts[0] not in TEST_AREAS:
            bad.append(f"{rel.as_posix()}: not in one of tests/{{{','.join(TEST_AREAS)}}}/")
        elif rel.parts[0] == "notebooks" and not re.match(r"test_(n\d\d_|all_)", path.name):
            bad.append(f"{rel.as_posix()}: a notebook's test is named test_nNN_<topic>.py (or test_all_<topic>.py)")
    assert not bad, "\n".join(bad)


# workers/<path> -> why it starts its own way, not on the scaffold (mnist_helpers/worker.py: @entry def cli)
OWN_ENTRY = {
    "progression/ddp_train.py": "a whole script that writes out the lines the scaffold hides (@record, the process "
                                "group, torchrun's environment, mp.spawn): 12's appendix shows it whole, the way the "
                                "learner's own train_ddp.py of 06 has them",
    "exercises/ddp_solution.py": "the learner's self-contained script: its starter is read out of this file",
    "exercises/ft_solution.py": "the learner's self-contained script: its starter is read out of this file",
    "exercises/hang_solution.py": "the learner's self-contained script: its starter is read out of this file",
    "demos/article_ddp.py": "the article's 5.2 script as written (12 runs and judges it as the article has it)",
    "bugs/spawn_main.py": "its bug lives in its `if __name__ == \"__main__\":` block: the block's mp.spawn of a "
                          "function of __main__, run as `python -c` text (a notebook's file-less __main__), is the "
                          "reproduction and its --fix",
    "bugs/local_rank.py": "its bug is the article's argparse line at its entry: argparse's own \"unrecognized "
                          "arguments\" must print as the article's readers see it; cli_entry would route it "
                          "through one rank's short message under torchrun",
    "bugs/restart_kill.py": "plain torch, nothing of the series: the restart rates (07.restarts, "
                            "scripts/bench_restarts.py) measure torchrun and torch alone, so the worker being "
                            "killed imports no series module (tests/workers/test_bugs_restart_kill.py)",
}
DEMOS_COMMON = "mnist_helpers.workers.demos.common"


def _main_block(tree: ast.Module, path: Path) -> list[ast.stmt] | None:
    """The statements under the module's ``if __name__ == "__main__":`` (a package's ``__main__.py``: its whole
    body); None when it has none."""
    if path.name == "__main__.py":
        return tree.body
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
                and [type(op) for op in node.test.ops] == [ast.Eq]
                and isinstance(node.test.comparators[0], ast.Constant) and node.test.comparators[0].value == "__main__"):
            return node.body
    return None


def _imported(nodes, name: str) -> set[str]:
    """The modules ``name`` is imported from (``from M import name``, unrenamed) among ``nodes``."""
    return {n.module for node in nodes for n in ast.walk(node) if isinstance(n, ast.ImportFrom)
            for a in n.names if a.name == name and a.asname is None}


def entry_problem(path: Path) -> str | None:
    """Why ``path``'s ``__main__`` does not start the scaffold's way, or None when it does (or has no ``__main__``).

    The scaffold's way: the block calls ``cli(...)``, a module-level function decorated ``@entry`` imported from
    ``mnist_helpers.worker``; a demo module may call ``cli`` imported from ``mnist_helpers.workers.demos.common``
    (12's demos share that one entry point, itself ``@entry``). Read with ``ast``: nothing is imported."""
    tree = ast.parse(path.read_text())
    block = _main_block(tree, path)
    if block is None:
        return None
    calls = [n for stmt in block for n in ast.walk(stmt)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "cli"]
    if not calls:
        return "its __main__ block calls no cli()"
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cli"]
    if defs:
        decorators = [d.id for d in defs[-1].decorator_list if isinstance(d, ast.Name)]
        if "entry" not in decorators:
            return f"its cli is not decorated with @entry (decorators: {decorators or 'none'})"
        if _imported(tree.body, "entry") != {"mnist_helpers.worker"}:
            return "its @entry is not imported from mnist_helpers.worker"
        return None
    if path.parent.name == "demos" and _imported(tree.body, "cli") == {DEMOS_COMMON}:
        common = entry_problem(PKG / "workers" / "demos" / "common.py")
        return f"{DEMOS_COMMON}.cli: {common}" if common else None
    return f"its cli is neither defined here with @entry nor imported from {DEMOS_COMMON} (a demo)"


def test_every_worker_starts_on_the_scaffold():
    """Every worker with a ``__main__`` starts one way: ``sys.exit(cli())`` (or ``exit_now(cli())``) of an ``@entry``
    ``cli`` (mnist_helpers/worker.py: torchrun's @record + the series' error boundary), or, for 12's demos, the
    dispatcher's ``cli`` of ``demos/common`` (itself ``@entry``), unless ``OWN_ENTRY`` says why not. An entry of
    ``OWN_ENTRY`` that no longer exists, has no ``__main__`` or starts the scaffold's way is stale."""
    root = PKG / "workers"
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        problem = entry_problem(path)
        if problem and rel not in OWN_ENTRY:
            bad.append(f"workers/{rel}: {problem}")
        elif rel in OWN_ENTRY and not problem:
            bad.append(f"workers/{rel} is in OWN_ENTRY but has no __main__ or starts the scaffold's way: remove it")
    bad += [f"workers/{rel} is in OWN_ENTRY but does not exist" for rel in OWN_ENTRY if not (root / rel).is_file()]
    assert not bad, "workers that do not start on the scaffold (@entry def cli):\n" + "\n".join(bad)
