"""The code keeps the rule import-linter cannot check: no module uses another's private names.

Layers and forbidden imports are import-linter contracts (`make lint`, `pyproject.toml`); this
test covers private names (`_name`) of the project's modules, imported (`from m import _name`)
or reached through a module (`m._name`), in the product and in the tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fullthrottle", "pipelines", "components", "trainer_module", "serving", "tests")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(module: str, tree: ast.AST, project: set[str]) -> list[str]:
    """``module``'s uses of another project module's private names, as "line: text"."""
    uses = []
    aliases: dict[str, str] = {}  # local name -> project module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in project:
                    aliases[alias.asname or alias.name] = target
                elif node.module in project and node.module != module and _is_private(alias.name):
                    uses.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in project and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and aliases.get(node.value.id, module) != module
        ):
            uses.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return uses


def test_private_uses_are_found():
    project = {"a", "pkg", "pkg.b"}
    source = "from pkg.b import _x, y\nimport pkg.b as bee\nfrom pkg import b as m\nm._z\nbee._w\n"
    uses = private_uses("a", ast.parse(source), project)
    assert uses == ["1: from pkg.b import _x", "4: m._z", "5: bee._w"]
    assert private_uses("pkg.b", ast.parse("from pkg.b import _x\n"), project) == []


def test_no_module_uses_another_modules_private_names():
    modules = _modules()
    project = set(modules)
    found = {
        name: uses
        for name, path in modules.items()
        if (uses := private_uses(name, ast.parse(path.read_text(encoding="utf-8")), project))
    }
    assert not found, f"private names used across modules (make them public or move them): {found}"
