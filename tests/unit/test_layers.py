"""The house's rules, checked on the source: imports only go down the layers that
docs/architecture.md lists, the modules' import graph has no circle, no
function is over 60 lines except argparse tables, and an import inside a
function says why it is lazy in a comment.

Imports are read with ``ast``, so those inside functions and under
``if TYPE_CHECKING:`` count like any other.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "ddlcomm"
MAX_FUNCTION_LINES = 60
#: Calls that make up an argparse table (a function of nothing else may be long).
ARGPARSE_CALLS = {"add_argument", "add_parser", "add_subparsers", "add_argument_group",
                  "add_mutually_exclusive_group", "set_defaults"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(module: str, tree: ast.AST) -> set[str]:
    """The ddlcomm modules ``module`` imports (package attributes: the package)."""
    is_pkg = MODULES[module].name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:      # a.b.attr -> a.b
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    out.discard(module)
    return out


GRAPH = {m: imported(m, ast.parse(p.read_text())) for m, p in MODULES.items()}


def unit(module: str) -> str:
    """The layer table's name of a module: ddlcomm's top-level module or package."""
    parts = module.split(".")
    return "ddlcomm" if len(parts) == 1 else parts[1]


def layers() -> dict[str, int]:
    """``unit -> layer`` from the table under "## Layers" in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for number, cell in re.findall(r"^\| *(\d+) *\|([^|]*)\|", section, re.M):
        for name in re.findall(r"`([^`]+)`", cell):
            out[name.strip("/").removesuffix(".py")] = int(number)
    return out


def test_every_module_has_a_layer():
    table = layers()
    assert sorted({unit(m) for m in MODULES} - set(table)) == []


def test_imports_go_down_the_layers():
    table = layers()
    upward = [f"{m} (layer {table[unit(m)]}) imports {t} (layer {table[unit(t)]})"
              for m, targets in GRAPH.items() for t in sorted(targets)
              if table[unit(t)] > table[unit(m)]]
    assert upward == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    # A package imports its own submodules when it is imported: not a circle of ours.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in GRAPH.items()}
    assert circles(graph) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def is_argparse_table(fn: ast.FunctionDef) -> bool:
    """Whether most statements of ``fn`` add arguments or sub-parsers."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in ARGPARSE_CALLS]
    return len(calls) * 2 >= len(fn.body)


def long_functions() -> list[str]:
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not is_argparse_table(node):
                    out.append(f"{module}.{node.name}: {lines} lines")
    return out


def test_no_long_functions():
    assert long_functions() == []


def comment_lines(source: str) -> set[int]:
    """Numbers of the lines that hold a ``#`` comment."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT}


def uncommented_lazy_imports(source: str) -> list[int]:
    """Lines of imports inside functions with no comment on that line or the line above."""
    comments = comment_lines(source)
    return sorted({node.lineno
                   for fn in ast.walk(ast.parse(source))
                   if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   and not {node.lineno, node.lineno - 1} & comments})


def test_lazy_imports_say_why():
    # Imports go at the top of a file unless waiting keeps an optional dependency
    # optional (or start-up fast); such an import says so in a comment.
    missing = [f"{module}:{line}" for module, path in MODULES.items()
               for line in uncommented_lazy_imports(path.read_text())]
    assert missing == []


@pytest.mark.parametrize("source, expected", [
    ("import torch", []),
    ("def f():\n    import torch", [2]),
    ("def f():\n    # torch is optional\n    import torch", []),
    ("def f():\n    import torch  # torch is optional", []),
    ("def f():\n    # torch is optional\n\n    import torch", [4]),
    ("def f():\n    s = '# not a comment'\n    import torch", [3]),
    ("class A:\n    def f(self):\n        def g():\n            from . import x", [4]),
])
def test_uncommented_lazy_imports_are_found(source, expected):
    assert uncommented_lazy_imports(source) == expected


@pytest.mark.parametrize("source, expected", [
    ("from ..errors import UsageError", {"ddlcomm.errors"}),
    ("from .. import memory", {"ddlcomm.memory"}),
    ("from ..comm.native import TAG", {"ddlcomm.comm.native"}),
    ("def f():\n    from ..report import tables", {"ddlcomm.report.tables"}),
    ("if TYPE_CHECKING:\n    from ..comm.base import Communicator", {"ddlcomm.comm.base"}),
    ("import numpy as np", set()),
])
def test_imports_are_read_inside_functions_and_type_checking(source, expected):
    assert imported("ddlcomm.bench.runner", ast.parse(source)) == expected
