"""Every command the series documents is checked: its module exists and its flags parse.

Commands are collected from the package's docstrings and comments, the README, docs/*.md (where the README's long
material lives: docs/CLUSTERS.md, docs/REFERENCE.md, ...), scripts/ and the notebooks:
each line that runs ``python -m mnist_helpers...`` or ``torchrun ... -m mnist_helpers...`` (with ``\\``
continuations joined). One subprocess then runs each command's module as ``__main__`` with the documented
arguments, up to the moment its parser has parsed them (``ArgumentParser.parse_args`` is wrapped to stop
there), so a flag that the worker does not accept (``--num_epochs`` where the flag is ``--epochs``) fails
this test without training anything. torchrun's own options go through torchrun's parser.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"(?:^|[\s`'\"$!(])((?:python3?|torchrun)\s[^`'\"\n]*?-m\s+mnist_helpers[\w.]*[^`'\"\n]*)")
# placeholders a reader replaces; they parse as the strings or numbers below
PLACEHOLDERS = {"{root}": "data", "NODE0": "localhost", "HOST:": "localhost:", "$NODE_RANK": "0", "${NODE_RANK}": "0"}
# torchrun("mnist_helpers.workers...", ["--epochs", "1"], ...) in a docstring or a notebook: a launch from Python
LAUNCH = re.compile(r"torchrun\(\s*[\"'](mnist_helpers[\w.]+)[\"']\s*,\s*\[([^\]]*)\]")
UNCHECKABLE = ("...", "<", "[", "module:fu", "package.module")  # elisions and argument templates


def _texts():
    for path in sorted((REPO / "mnist_helpers").rglob("*.py")):
        yield path, path.read_text()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "scripts").rglob("*.py"))]:
        if path.exists():
            yield path, path.read_text()
    for path in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(c["source"]) for c in cells)


def commands_in(text: str) -> list[str]:
    """The commands one file documents, in order."""
    found = []
    text = re.sub(r"\\\\?\n\s*", " ", text)  # join shell continuations (also inside docstrings: "\\\n")
    for line in text.splitlines():
        for m in COMMAND.finditer(line):
            cmd = m.group(1).split("  #")[0].split(" # ")[0].strip().rstrip(".,;:)")
            if any(u in cmd for u in UNCHECKABLE):
                continue
            for k, v in PLACEHOLDERS.items():
                cmd = cmd.replace(k, v)
            found.append(cmd)
    for m in LAUNCH.finditer(text):
        try:
            args = ast.literal_eval("[" + m.group(2) + "]")
        except (ValueError, SyntaxError):
            continue  # built from variables: the notebook's own run checks it
        if not all(isinstance(a, (str, int, float)) for a in args):
            continue  # [...] elides the arguments
        found.append(shlex.join(["python", "-m", m.group(1), *map(str, args)]))
    return found


def documented_commands() -> list[tuple[str, str]]:
    found = {}
    for path, text in _texts():
        for cmd in commands_in(text):
            found.setdefault(cmd, str(path.relative_to(REPO)))
    return sorted((cmd, where) for cmd, where in found.items())


CHECKER = r'''
import argparse, json, runpy, shlex, sys

class Parsed(Exception):
    pass

orig_parse_known = argparse.ArgumentParser.parse_known_args

def parse_known_args(self, args=None, namespace=None):
    ns, extra = orig_parse_known(self, args, namespace)
    if self.prog != "torchrun-check":
        raise Parsed(extra)
    return ns, extra

argparse.ArgumentParser.parse_known_args = parse_known_args

def check(cmd):
    words = shlex.split(cmd)
    if words[:3] == ["python", "-m", "torch.distributed.run"]:
        words = ["torchrun"] + words[3:]
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser
        i = words.index("-m")
        p = get_args_parser()
        p.prog = "torchrun-check"
        p.parse_args(words[1:i] + ["--no-python", "true"])  # torchrun's own options
        module, args = words[i + 1], words[i + 2:]
    else:
        i = words.index("-m")
        module, args = words[i + 1], words[i + 2:]
    sys.argv = [module] + args
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Parsed as e:
        extra = e.args[0]
        return None if not extra else f"unrecognized arguments: {extra}"
    except SystemExit as e:
        return None if e.code in (0, None) and "--help" in args else f"exited with {e.code} before parsing"
    return "ran to the end without parsing any arguments"

results = {}
for cmd in json.loads(sys.stdin.read()):
    try:
        results[cmd] = check(cmd)
    except SystemExit as e:
        results[cmd] = f"argument error (exit {e.code})"
    except Exception as e:
        results[cmd] = f"{type(e).__name__}: {e}"
print("RESULTS" + json.dumps(results))
'''


@pytest.mark.process
def test_documented_commands_parse():
    commands = documented_commands()
    assert len(commands) >= 20, f"found only {len(commands)} documented commands: the collector is broken"
    proc = subprocess.run([sys.executable, "-c", CHECKER], input=json.dumps([c for c, _ in commands]),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")]
    assert line, f"the checker failed:\n{proc.stderr[-3000:]}"
    results = json.loads(line[-1][len("RESULTS"):])
    where = dict(commands)
    bad = {f"{cmd}  ({where[cmd]})": err for cmd, err in results.items() if err}
    assert not bad, "documented commands that do not parse:\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())


def test_the_readme_and_docs_are_collected():
    """The README and the pages its long material moved to (docs/) are read: their commands are among those run."""
    scanned = {path.relative_to(REPO).as_posix() for path, _ in _texts()}
    assert "README.md" in scanned and {"docs/CLUSTERS.md", "docs/REFERENCE.md"} <= scanned
    readme = commands_in((REPO / "README.md").read_text())
    assert "python -m mnist_helpers.data --root data" in readme
    clusters = commands_in((REPO / "docs" / "CLUSTERS.md").read_text())
    assert any(c.startswith("torchrun --nnodes=2") and "--rdzv-endpoint=localhost:29400" in c for c in clusters), \
        clusters
    assert set(readme + clusters) <= {c for c, _ in documented_commands()}


@pytest.mark.process
@pytest.mark.parametrize("cmd", ["python -m mnist_helpers.workers.progression.ddp_train --num_epochs 1"])
def test_the_checker_catches_a_wrong_flag(cmd):
    proc = subprocess.run([sys.executable, "-c", CHECKER], input=json.dumps([cmd]), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    results = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")][-1][len("RESULTS"):])
    assert results[cmd], "a flag the worker rejects must be reported"
