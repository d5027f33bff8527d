"""The package's shape, read from its imports (ast, nothing is imported): no import circle (the
registries name their built-in plug-ins and import them by name, so not even they close one), no
import from a lower layer into a higher one (the layers docs/architecture.md states, read from its
``layers`` block), no import of another module's private name, and every built-in backend in a
module named after its ``impl``.  Each check is a function of a module graph, run on the package and
on a small synthetic graph that breaks it (so the checks can fail)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ple_bench"
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"

#: the registries: tables of their built-in plug-ins' names, imported by name when asked for
BACKEND_REGISTRY = PACKAGE / "backends" / "registry.py"
KERNEL_REGISTRY = PACKAGE / "backends" / "kernels.py"


# ------------------------------------------------------------------ reading the package
def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def read_sources(root: Path) -> dict[str, tuple[str, bool]]:
    """module name -> (source text, is a package's __init__)."""
    return {module_name(p, root): (p.read_text(), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))}


def imports_of(sources: dict[str, tuple[str, bool]]) -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported module, imported name or "", line)], every import statement (at the top
    or inside a function: a circle hidden in a function is still a circle).  ``from pkg import mod``
    counts as an import of ``pkg.mod`` when ``pkg.mod`` is a module."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    for module, (text, is_package) in sources.items():
        found = out.setdefault(module, [])
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found += [(alias.name, "", node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(module, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub, "", node.lineno) if sub in sources else (base, alias.name, node.lineno))
    return out


def graph_of(imports: dict[str, list[tuple[str, str, int]]], prefix: str = "ple_bench") -> dict[str, set[str]]:
    return {m: {t for t, _, _ in found if t.startswith(prefix) and t != m} for m, found in imports.items()}


# ------------------------------------------------------------------ the checks
def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def read_layers(text: str) -> list[list[str]]:
    """The layers, lowest first, from the doc's fenced ``layers`` block: one line per layer,
    ``N  name, name, ...`` (module or package names under ``ple_bench``)."""
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        if line.strip():
            _, names = line.split(None, 1)
            layers.append([f"ple_bench.{n.strip()}" if n.strip() != "ple_bench" else "ple_bench"
                           for n in names.split(",")])
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The layer of the most specific name that is ``module`` or a package above it."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(layers):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[0]:
                    best = (len(name), i)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports from a module into one of a higher layer (modules no layer names are reported too)."""
    bad = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module, layers)
        if mine is None:
            bad.append(f"{module}: in no layer")
            continue
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if theirs is not None and theirs > mine:
                bad.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    return bad


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(sources: dict[str, tuple[str, bool]], imports) -> list[str]:
    """Imports of another module's private name (``from m import _x``), and ``m._x`` where ``m`` is a
    module of the package imported by name."""
    bad = []
    for module, found in sorted(imports.items()):
        bad += [f"{module}:{line}: imports {target}.{name}" for target, name, line in found
                if name and is_private(name) and target.startswith("ple_bench") and target != module]
        text, is_package = sources[module]
        tree = ast.parse(text)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = resolve(module, is_package, node.level, node.module)
                for alias in node.names:
                    if f"{base}.{alias.name}" in sources:
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in sources:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and is_private(node.attr)):
                bad.append(f"{module}:{node.lineno}: uses {aliases[node.value.id]}.{node.attr}")
    return bad


# ------------------------------------------------------------------ the package
@pytest.fixture(scope="module")
def package():
    sources = read_sources(PACKAGE)
    imports = imports_of(sources)
    return sources, imports, graph_of(imports)


def test_no_import_circle(package):
    _, _, graph = package
    assert cycles(graph) == []


def test_no_import_from_a_lower_layer_into_a_higher_one(package):
    _, _, graph = package
    assert upward_imports(graph, read_layers(ARCHITECTURE_DOC.read_text())) == []


def test_no_module_takes_another_modules_private_name(package):
    sources, imports, _ = package
    assert private_uses(sources, imports) == []


def table_of(path: Path, name: str):
    """The literal value assigned to ``name`` at the top of ``path`` (read, not imported)."""
    for node in ast.parse(path.read_text()).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} assigns no {name}")


def builtin_problems(table: dict[str, str], sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Entries of the backend table whose module is not ``ple_bench.backends.<impl>``, is not in
    the package, or has no class of that name declaring ``name = "<impl>"``."""
    bad = []
    for impl, path in sorted(table.items()):
        module, _, cls = path.partition(":")
        if module != f"ple_bench.backends.{impl}":
            bad.append(f"{impl}: module {module} is not named after the impl")
        if module not in sources:
            bad.append(f"{impl}: no module {module}")
            continue
        classes = {n.name: n for n in ast.parse(sources[module][0]).body if isinstance(n, ast.ClassDef)}
        names = [ast.literal_eval(s.value) for s in getattr(classes.get(cls), "body", [])
                 if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name" for t in s.targets)]
        if names != [impl]:
            bad.append(f"{impl}: class {cls} in {module} declares name = {names or 'nothing'}")
    return bad


def test_every_builtin_backend_lives_in_a_module_named_after_its_impl(package):
    sources, _, _ = package
    table = table_of(BACKEND_REGISTRY, "BUILTIN")
    assert {"device", "pinned_uva", "pinned_host_flag"} <= set(table)
    assert builtin_problems(table, sources) == []


def test_the_registries_name_their_plug_ins_and_import_none(package):
    """The registries import no plug-in (they are named in a table and loaded by name) and every
    kernel module they name exists."""
    sources, _, graph = package
    for registry in ("ple_bench.backends.registry", "ple_bench.backends.kernels"):
        assert graph[registry] <= {"ple_bench.backends.base", "ple_bench.backends.formats"}, registry
    for module in table_of(KERNEL_REGISTRY, "KERNEL_MODULES"):
        assert module in sources


# ------------------------------------------------------------------ the checks can fail
SYNTHETIC = {
    "ple_bench.units": ("", False),
    "ple_bench.low": ("from .high import run\nfrom .units import _secret\n", False),
    "ple_bench.high": ("from . import low\nfrom . import units\nx = units._hidden\n", False),
    "ple_bench.backends.registry": ("def load():\n    from . import plug\n", False),
    "ple_bench.backends.plug": ("from .registry import load\n", False),
}
SYNTHETIC_LAYERS = "```layers\n0  units, low\n1  backends\n2  high\n```\n"


def test_the_checks_flag_a_synthetic_bad_graph():
    imports = imports_of(SYNTHETIC)
    graph = graph_of(imports)
    assert cycles(graph) == [["ple_bench.backends.plug", "ple_bench.backends.registry"],
                             ["ple_bench.high", "ple_bench.low"]]
    assert upward_imports(graph, read_layers(SYNTHETIC_LAYERS)) == [
        "ple_bench.low (layer 0) imports ple_bench.high (layer 2)"]
    assert private_uses(SYNTHETIC, imports) == ["ple_bench.high:3: uses ple_bench.units._hidden",
                                                "ple_bench.low:2: imports ple_bench.units._secret"]


def test_the_builtin_check_flags_a_misplaced_or_misnamed_backend():
    sources = {
        "ple_bench.backends.fast": ("class Fast:\n    name = 'fast'\n", False),
        "ple_bench.backends.paths": ("class Slow:\n    name = 'slow'\n", False),
        "ple_bench.backends.wrong": ("class Wrong:\n    name = 'other'\n", False),
    }
    table = {"fast": "ple_bench.backends.fast:Fast", "slow": "ple_bench.backends.paths:Slow",
             "wrong": "ple_bench.backends.wrong:Wrong", "gone": "ple_bench.backends.gone:Gone"}
    assert builtin_problems(table, sources) == [
        "gone: no module ple_bench.backends.gone",
        "slow: module ple_bench.backends.paths is not named after the impl",
        "wrong: class Wrong in ple_bench.backends.wrong declares name = ['other']",
    ]
