"""Every name ddlcomm's source takes from torch, CuPy, NumPy or mpi4py exists in the
installed version.

Much of the code that reaches these libraries runs only on a GPU machine
(``torch.cuda``, CuPy, NCCL), which CI does not have: a misspelt or removed
name there would first show as a crash in scarce GPU time.  Each dotted chain
rooted in an imported library (``torch.cuda.current_stream``,
``runtime.pointerGetAttributes`` after ``from cupy.cuda import runtime``, ...)
is read with ``ast`` and resolved attribute by attribute, importing submodules
where an attribute is one.  Names reached through objects (a tensor's
methods) are not seen.  A library that is not installed is skipped, with the
reason.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "src" / "ddlcomm").rglob("*.py"))
LIBRARIES = ("torch", "cupy", "numpy", "mpi4py")


def imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted library name it is bound to, for every import of a library
    (at any depth of ``tree``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in LIBRARIES:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def getters(trees) -> dict[str, str]:
    """Function name -> library, for every function that imports a library and returns it
    (``def _torch(): import torch; return torch``): a call of it stands for the library."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.body and isinstance(node.body[-1], ast.Return) \
                    and isinstance(node.body[-1].value, ast.Name):
                bound = imports(node).get(node.body[-1].value.id)
                if bound is not None:
                    out[node.name] = bound
    return out


def dotted(node: ast.AST, names: dict[str, str], calls: dict[str, str]) -> str | None:
    """The library name ``node`` stands for (an alias, a getter's call, an attribute chain
    on either), or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        root = names.get(node.id)
    elif isinstance(node, ast.Call) and not node.args:
        func = node.func
        root = calls.get(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None))
    else:
        return None
    return None if root is None else ".".join([root, *reversed(parts)])


def chains(tree: ast.AST, calls: dict[str, str] | None = None) -> set[str]:
    """Every dotted name of a library the module uses: its imports, names assigned from
    them (``dist = _dist``, ``torch = _torch()``: ``calls`` maps getters' names to their
    library, also where imported as another name), and the attribute chains rooted in
    either (only the longest chain of each expression)."""
    calls = dict(calls or {})
    for node in ast.walk(tree):            # a getter imported under another name
        if isinstance(node, ast.ImportFrom):
            calls.update({a.asname: calls[a.name] for a in node.names if a.asname and a.name in calls})
    names = imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound = dotted(node.value, names, calls)
            if bound is not None:
                names[node.targets[0].id] = bound
    out = set(names.values())
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            n = node
            while isinstance(n, ast.Attribute):
                inner.add(id(n.value))
                n = n.value
            found = dotted(node, names, calls)
            if found is not None:
                out.add(found)
    return out


def unresolved(dotted: str) -> str | None:
    """The first prefix of ``dotted`` that names nothing, or None when all of it resolves."""
    parts = dotted.split(".")
    obj, path = importlib.import_module(parts[0]), parts[0]
    for part in parts[1:]:
        path = f"{path}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(path)
        except ImportError:
            return path
    return None


def used() -> dict[str, dict[str, list[str]]]:
    """library -> dotted name -> the source files that use it."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in SOURCES}
    calls = getters(trees.values())
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, tree in trees.items():
        for name in chains(tree, calls):
            out[name.split(".")[0]][name].append(str(path.relative_to(ROOT)))
    return out


USED = used()


def test_the_reader_finds_chains_through_aliases_assignments_and_getters():
    tree = ast.parse("import torch\nimport torch.distributed as dist\nfrom cupy.cuda import runtime\n"
                     "def f():\n    torch.cuda.current_stream().synchronize()\n"
                     "    dist.all_reduce\n    runtime.pointerGetAttributes(0).type\n"
                     "def _np():\n    import numpy\n    return numpy\n"
                     "def g():\n    global d\n    d = dist\n    d.barrier\n"
                     "    np = _np()\n    np.linalg.norm\n    _np().add\n")
    calls = getters([tree, ast.parse("def torch_module():\n    import torch\n    return torch\n")])
    assert calls == {"_np": "numpy", "torch_module": "torch"}
    assert chains(tree, calls) == {
        "torch", "torch.distributed", "cupy.cuda.runtime", "numpy",
        "torch.cuda.current_stream", "torch.distributed.all_reduce",
        "cupy.cuda.runtime.pointerGetAttributes", "torch.distributed.barrier",
        "numpy.linalg.norm", "numpy.add"}
    other = ast.parse("from ..lazy import torch_module as _t\nx = _t().cuda.synchronize\n")
    assert chains(other, calls) == {"torch.cuda.synchronize"}


def test_a_missing_name_is_named():
    assert unresolved("numpy.linalg.norm") is None
    assert unresolved("numpy.linalg.no_such_name.x") == "numpy.linalg.no_such_name"


#: torch and CuPy carry the ``gpu`` mark too, so that scripts/gpu-check (``pytest -m gpu``) checks
#: them against the GPU machine's versions; the mark does not skip them here.
PARAMS = [pytest.param(lib, marks=pytest.mark.gpu) if lib in ("torch", "cupy") else lib
          for lib in LIBRARIES]


@pytest.mark.parametrize("library", PARAMS)
def test_every_name_used_exists(library):
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed here: its {len(USED[library])} names "
                    "are checked where it is (the GPU machine for CuPy)")
    if library == "mpi4py":
        try:
            importlib.import_module("mpi4py.MPI")
        except (ImportError, RuntimeError) as exc:       # RuntimeError: no libmpi found
            pytest.skip(f"mpi4py finds no MPI library here: {str(exc).splitlines()[0]}")
    missing = {}
    for dotted, files in sorted(USED[library].items()):
        where = unresolved(dotted)
        if where is not None:
            missing[where] = sorted(set(files))
    assert not missing, f"names not in the installed {library}: {missing}"
