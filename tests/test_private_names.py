"""No module of toolkit/ reaches into another's private names: a name with a leading underscore is used only
where it is defined. Counted with ``ast`` over every host module (docs/design.md, "Public faces"):

- private names imported across modules: ``from toolkit.x import _name`` (or relative), and a private module
  imported from outside its own package;
- a library's private module imported (``from torch.utils._pytree import ...``): through toolkit/compat/;
- private attributes touched from outside: ``obj._attr`` (read, written or deleted, or through
  ``getattr``/``setattr``/``hasattr``/``delattr`` with a literal name) where ``obj`` is not the ``self``/``cls``
  of the method it is written in (``super()._x`` is the class's own too). ``other._x`` inside the class counts:
  an object's private state is its own.

Excluded, each with its reason: toolkit/compat/ (the one place a third-party library's private members are
touched, each named there and checked against the pin by tests/test_compat.py), and toolkit/device_side/ (the
single files shipped to the device, assembled from blocks under the runner's own rules: Python >= 3.6 and no
toolkit imports, so a runtime's private member cannot go through toolkit/compat/ there; 7 at this writing, all
third-party: ExecuTorch's and LiteRT's).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "toolkit"
COMPAT = ROOT / "compat"
DEVICE_SIDE = ROOT / "device_side"
# underscore names that are public API of the standard library (namedtuple's), not private state
PUBLIC_UNDERSCORE = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
PUBLIC_QUALIFIED = frozenset({"os._exit", "sys._getframe"})  # documented functions of the standard library
REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package(path: Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])


def _module_of(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative ones resolved against ``path``)."""
    if not node.level:
        return node.module or ""
    base = _package(path).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


class _Scan(ast.NodeVisitor):
    """The reach-ins of one module (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path.relative_to(ROOT.parent))
        self.found: list[str] = []
        self.scopes: list[tuple[str, str | None]] = []  # ("class", None) / ("def", its self or cls, if a method)

    def _owners(self) -> set[str]:
        return {name for kind, name in self.scopes if kind == "def" and name}

    def _hit(self, node: ast.AST, text: str) -> None:
        self.found.append(f"{self.where}:{getattr(node, 'lineno', '?')}: {text}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append(("class", None))
        self.generic_visit(node)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        in_class = bool(self.scopes) and self.scopes[-1][0] == "class"
        is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        first = node.args.posonlyargs + node.args.args
        owner = first[0].arg if in_class and not is_static and first else None
        self.scopes.append(("def", owner))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.scopes.append(("def", None))  # a lambda's own parameters are never the class's self
        self.generic_visit(node)
        self.scopes.pop()

    def _is_own(self, value: ast.expr) -> bool:
        if isinstance(value, ast.Name) and value.id in self._owners():
            return True
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _module_of(self.path, node)
        if module.split(".")[0] != "toolkit" and any(_private(part) for part in module.split(".")):
            self._hit(node, f"from {module} import ... (a library's private module: through toolkit/compat/)")
        if module.split(".")[0] == "toolkit":
            for alias in node.names:
                if _private(alias.name):
                    self._hit(node, f"from {module} import {alias.name}")
            parts = module.split(".")
            for i, part in enumerate(parts):
                if _private(part) and not _package(self.path).startswith(".".join(parts[:i])):
                    self._hit(node, f"from {module} import ... (a private module from outside its package)")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] != "toolkit" and any(_private(part) for part in parts):
                self._hit(node, f"import {alias.name} (a library's private module: through toolkit/compat/)")
            for i, part in enumerate(parts):
                if parts[0] == "toolkit" and _private(part) and \
                        not _package(self.path).startswith(".".join(parts[:i])):
                    self._hit(node, f"import {alias.name} (a private module from outside its package)")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr) and node.attr not in PUBLIC_UNDERSCORE and not self._is_own(node.value) \
                and ast.unparse(node) not in PUBLIC_QUALIFIED:
            self._hit(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in REFLECTION and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value) \
                    and not self._is_own(node.args[0]):
                self._hit(node, ast.unparse(node))
        self.generic_visit(node)


def reach_ins(paths: list[Path]) -> list[str]:
    found: list[str] = []
    for path in paths:
        scan = _Scan(path)
        scan.visit(ast.parse(path.read_text(), filename=str(path)))
        found += scan.found
    return found


def host_modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not p.is_relative_to(COMPAT) and not p.is_relative_to(DEVICE_SIDE))


@pytest.mark.fast
def test_no_private_name_is_used_outside_its_module_or_class():
    found = reach_ins(host_modules())
    imports = [f for f in found if ": from " in f or ": import " in f]
    attributes = [f for f in found if f not in imports]
    assert (len(imports), len(attributes)) == (0, 0), (
        "private names used outside their module or class (make the name public and document it, or add a method "
        "that says what the caller needs; a third-party library's private member goes through toolkit/compat/):\n"
        + "\n".join(found))


@pytest.mark.fast
def test_the_scan_sees_each_kind_of_reach_in(tmp_path):
    """The counter itself: each kind of reach-in it must see is seen, and what is the class's own is not."""
    package = tmp_path / "toolkit" / "room"
    package.mkdir(parents=True)
    module = package / "mod.py"
    module.write_text(
        "from toolkit.other import _helper, public\n"
        "from ._private_mod import thing\n"
        "from toolkit.elsewhere._hidden import thing2\n"
        "import toolkit.elsewhere._hidden\n"
        "from torch.utils._pytree import tree_map\n"
        "class C:\n"
        "    def __init__(self, other):\n"
        "        self._mine = 1\n"
        "        other._theirs = 2\n"
        "        f = lambda x: x._lam\n"
        "        super()._base()\n"
        "        getattr(other, '_reflected')\n"
        "        getattr(self, '_own_reflected')\n"
        "    @staticmethod\n"
        "    def s(self):\n"
        "        return self._not_really_self\n"
        "    def m(self):\n"
        "        def inner():\n"
        "            return self._closure, self.conn._deep\n"
        "        return inner, self.__dict__, x._replace(), os._exit\n"
        "def f(conn):\n"
        "    return conn._transport\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path / "toolkit"
    try:
        found = [line.split(": ", 1)[1] for line in reach_ins([module])]
    finally:
        ROOT = saved
    assert found == [
        "from toolkit.other import _helper",
        "from toolkit.elsewhere._hidden import ... (a private module from outside its package)",
        "import toolkit.elsewhere._hidden (a private module from outside its package)",
        "from torch.utils._pytree import ... (a library's private module: through toolkit/compat/)",
        "other._theirs", "x._lam", "getattr(other, '_reflected')", "self._not_really_self", "self.conn._deep",
        "conn._transport",
    ], found

