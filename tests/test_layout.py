"""The package's shape: the core never imports a plugin, imports form no cycle, no code
reaches into another object's private attributes and no module re-exports what it imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"schedlab": "framework", "schedlab.plugins": "plugins", "schedlab.kernels": "kernels"}


def _modules() -> dict[str, Path]:
    mods = {}
    for name, folder in ROOTS.items():
        base = ROOT / folder
        for f in base.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = f
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """schedlab modules imported anywhere in the file (lazy ones too), except under
    `if TYPE_CHECKING:`."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            t = node.test
            if getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == \
                    "TYPE_CHECKING":
                for n in node.orelse:
                    self.visit(n)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 0 and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    found.add(full if full in mods else node.module)

    Visitor().visit(ast.parse(path.read_text()))
    return {m for m in found if m in mods}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(f, mods) - {m} for m, f in mods.items()}


def _plugin_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(core module, plugin module) pairs where the core imports a plugin."""
    return sorted((m, i) for m, deps in graph.items() if not m.startswith("schedlab.plugins")
                  for i in deps if i.startswith("schedlab.plugins."))


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_core_module_imports_a_plugin_module():
    bad = _plugin_imports(_graph())
    assert not bad, f"the core must load plugins through the registry: {bad}"


def test_import_graph_has_no_cycle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_see_a_cycle_and_a_plugin_import(tmp_path, monkeypatch):
    """The two checks above can fail: a planted cycle and a planted plugin import are found."""
    pkg = tmp_path / "framework"
    pkg.mkdir()
    (pkg / "a.py").write_text("from schedlab.b import x\nimport schedlab.plugins.p\n")
    (pkg / "b.py").write_text("def f():\n    from schedlab import a\n")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "p.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    g = _graph()
    assert g["schedlab.a"] == {"schedlab.b", "schedlab.plugins.p"}
    assert g["schedlab.b"] == {"schedlab.a"}
    assert _find_cycle(g) == ["schedlab.a", "schedlab.b", "schedlab.a"]
    assert _plugin_imports(g) == [("schedlab.a", "schedlab.plugins.p")]


#: documented standard-library functions whose names start with "_", each used on purpose
STDLIB_UNDERSCORED = {
    "sys._current_frames",  # another thread's frame: the stall warning (schedlab.runs.stall)
}


def test_no_code_reaches_into_another_objects_private_attributes():
    found = []
    for folder in ROOTS.values():
        for f in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                        and not node.attr.startswith("__")
                        and not (isinstance(node.value, ast.Name)
                                 and node.value.id in ("self", "cls"))
                        and ast.unparse(node) not in STDLIB_UNDERSCORED):
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def _reexports(path: Path) -> list[str]:
    """`path:line: name` for each name a module re-exports: imported "as itself"
    (`from m import A as A`), or imported and listed in `__all__` outside a package's
    `__init__.py` (the one place that gathers a package's public names)."""
    tree = ast.parse(path.read_text())
    imported: dict[str, int] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                if a.asname is not None and a.asname == a.name.rpartition(".")[2]:
                    found.append(f"{path}:{node.lineno}: {a.name} as {a.asname}")
                imported[a.asname or a.name.partition(".")[0]] = node.lineno
    if path.name != "__init__.py":
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                     for t in node.targets)
                    and isinstance(node.value, ast.List | ast.Tuple)):
                for elt in node.value.elts:
                    if isinstance(elt, ast.Constant) and elt.value in imported:
                        found.append(f"{path}:{node.lineno}: __all__ lists imported "
                                     f"{elt.value!r}")
    return found


def test_no_module_reexports_a_name_it_imports():
    """A module's importers import from where a name is defined: no alias kept for a path."""
    found = [r for f in sorted(_modules().values()) for r in _reexports(f.relative_to(ROOT))]
    assert not found, "import from the defining module instead:\n" + "\n".join(found)


def test_the_reexport_check_sees_both_forms(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("from a import B as B\nfrom c import D\n__all__ = ['D']\n")
    (tmp_path / "__init__.py").write_text("from c import D\n__all__ = ['D']\n")
    monkeypatch.chdir(tmp_path)
    assert _reexports(Path("m.py")) == ["m.py:1: B as B", "m.py:3: __all__ lists imported 'D'"]
    assert _reexports(Path("__init__.py")) == []


def test_a_simulated_run_imports_neither_torch_nor_transformers(tmp_path):
    """`schedlab run executor=sim` needs shapes and costs only: no torch, no transformers."""
    import os
    import subprocess
    import sys

    args = ["run", "executor=sim", "model=llama3_8b", "hardware=a100", "logger=none",
            "workload.num_requests=4", "driver.progress=false", f"hydra.run.dir={tmp_path}"]
    code = ("import sys\nfrom schedlab.cli import main\nrc = main(sys.argv[1:])\n"
            "print('heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "WANDB_MODE": "offline"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "heavy: []" in out.stdout, out.stdout[-500:]
    assert (tmp_path / "results.json").is_file()
