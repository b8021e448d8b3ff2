"""The import rules of docs/ARCHITECTURE.md that the import contracts of pyproject.toml
(``lint-imports``: layers, no cycles inside a package) do not cover.

- Modules of the package import each other at module top. An import of a kernelarc module
  inside a function is allowed only where :data:`ALLOWED` names it, with the reason; such an
  entry must still exist and the module it imports must load a heavy dependency when
  imported (directly or through its own module-level imports).
- ``import kernelarc`` and the CLI (``kernelarc --help``) load none of torch, triton or
  matplotlib: the package imports them inside the functions that use them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "kernelarc"
HEAVY = ("torch", "triton", "matplotlib")

ALLOWED: dict[tuple[str, str], str] = {
    (
        "kernelarc.guard.candidate",
        "kernelarc.guard.compare",
    ): "compare imports torch: a worker imports torch only after its parent watch started",
    (
        "kernelarc.guard.worker",
        "kernelarc.guard.compare",
    ): "compare imports torch: a worker imports torch only after its parent watch started",
    (
        "kernelarc.guard.session",
        "kernelarc.guard.compare",
    ): "compare imports torch: the guard's parent process needs it for one check only",
    (
        "kernelarc.guard.compare",
        "kernelarc.guard.compare_fused",
    ): "compare_fused imports Triton: loaded only where the fused comparison runs",
}
"""(importing module, imported module) -> why the import is inside a function."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """Module names an import statement loads (``from a import b`` is ``a.b`` when that is
    a module of the package, else ``a``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    for alias in node.names:
        name = f"{source}.{alias.name}"
        yield name if name in MODULES else source


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> tuple[set[str], list[tuple[int, str]]]:
    """What ``module`` imports when it loads (TYPE_CHECKING blocks left out), and the
    (line, module) of every import inside a function."""
    path = MODULES[module]
    at_load: set[str] = set()
    in_functions: list[tuple[int, str]] = []

    def visit(nodes: list[ast.stmt] | list[ast.AST], in_function: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse, in_function)
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = set(_targets(node, module, path.name == "__init__.py"))
                if in_function:
                    in_functions.extend((node.lineno, n) for n in sorted(names))
                else:
                    at_load.update(names)
                continue
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(list(ast.iter_child_nodes(node)), in_function or function)

    visit(ast.parse(path.read_text()).body, False)
    return at_load, in_functions


def _loads_heavy(module: str) -> bool:
    """Whether importing ``module`` imports a heavy dependency."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        at_load, _ = _imports(current)
        if any(name.split(".")[0] in HEAVY for name in at_load):
            return True
        todo += [name for name in at_load if name in MODULES]
    return False


def _function_level_imports() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for module, path in MODULES.items():
        for line, name in _imports(module)[1]:
            if name == "kernelarc" or name.startswith("kernelarc."):
                where = f"{path.relative_to(SRC.parent)}:{line}"
                found.setdefault((module, name), []).append(where)
    return found


def test_no_function_level_imports_of_the_package_outside_the_allow_list() -> None:
    found = _function_level_imports()
    extra = [
        f"{where}: imports {imported}"
        for (module, imported), wheres in sorted(found.items())
        if (module, imported) not in ALLOWED
        for where in wheres
    ]
    assert not extra, "import these at module top, or allow them with a reason:\n" + "\n".join(
        extra
    )


def test_every_allowed_function_level_import_is_still_there_and_still_needed() -> None:
    found = _function_level_imports()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if (a, b) not in found]
    assert not stale, f"allow-list entries no longer in the code: {stale}"
    light = [f"{a} -> {b}" for a, b in ALLOWED if not _loads_heavy(b)]
    assert not light, f"these import no heavy dependency: import them at module top: {light}"


def test_the_heavy_dependency_check_sees_torch() -> None:
    assert _loads_heavy("kernelarc.guard.compare")
    assert not _loads_heavy("kernelarc.errors")


def test_the_package_and_its_cli_load_no_heavy_dependency() -> None:
    code = (
        "import sys, kernelarc, kernelarc.cli.main\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
