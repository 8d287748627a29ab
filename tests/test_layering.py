"""The package's floors: which part of harness/ may import which. Every import counts, the ones
inside functions too (they still tie the code together). docs/architecture.md draws the same
floors for a reader."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first: a module may import its own floor and the floors below it, never one above
FLOORS = (
    ("leaves", ("harness.util", "harness.libc", "harness.catalog")),
    ("declarations", ("harness.parameters", "harness.profile_keys", "harness.contract",
                      "harness.record")),
    ("box", ("harness.box",)),
    ("build", ("harness.build",)),
    ("models", ("harness.models",)),
    ("config", ("harness.bounds", "harness.config", "harness.profiles")),
    ("run", ("harness.run",)),
    ("fleet", ("harness.fleet",)),
    ("analysis", ("harness.analysis",)),
    # the ceilings and the calibration run measurements and judge them with the analysis's rules
    # (the attribution's I/O share)
    ("stages", ("harness.stages",)),
    ("report", ("harness.report",)),
    ("entry points", ("harness.docs", "harness.__main__")),
)


def modules_under(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the package under `root` (the package's own
    __init__, a docstring, stands on no floor)."""
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (root / "harness").rglob("*.py") if p != root / "harness" / "__init__.py"}


MODULES = modules_under(ROOT)


def floor_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} stands on no floor: add it to FLOORS and docs/architecture.md")


def imports_of(path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of this package imported, line) for every import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            for alias in node.names:  # `from harness import config` imports a module
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in modules else node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("harness")]
    return [(m, line) for m, line in out if m != "harness"]


def upward_imports(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    bad = []
    for name, path in modules.items():
        for target, line in imports_of(path, modules):
            if floor_of(target) > floor_of(name):
                bad.append(f"{path.relative_to(root)}:{line} imports {target} "
                           f"({FLOORS[floor_of(name)][0]} -> {FLOORS[floor_of(target)][0]})")
    return bad


def circles(modules: dict[str, Path]) -> list[list[str]]:
    """Every import circle among the modules (Tarjan's strongly connected components)."""
    graph = {m: {t for t, _ in imports_of(p, modules) if t in modules and t != m}
             for m, p in modules.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_every_module_stands_on_a_floor():
    for name in MODULES:
        floor_of(name)


def test_no_import_runs_up_a_floor():
    assert upward_imports(MODULES) == []


def test_no_import_circle_anywhere_in_the_package():
    assert circles(MODULES) == []


def test_the_checks_can_fail(tmp_path):
    """An import from the catalog (a leaf) up to the runtime, and a pair that import each other,
    are both found; a module on no floor is named."""
    (tmp_path / "harness" / "run").mkdir(parents=True)
    (tmp_path / "harness" / "catalog.py").write_text("from harness.run.mechanisms import REGISTRY\n")
    (tmp_path / "harness" / "run" / "mechanisms.py").write_text("from harness import catalog\n")
    fake = modules_under(tmp_path)
    assert upward_imports(fake, tmp_path) == [
        "harness/catalog.py:1 imports harness.run.mechanisms (leaves -> run)"]
    assert circles(fake) == [["harness.catalog", "harness.run.mechanisms"]]
    with pytest.raises(AssertionError, match="stands on no floor"):
        floor_of("harness.newplace")
