"""The library's import graph: no cycles, and every import goes down the layers listed in the README
("Layout"), so a lower module never reaches up into a higher one. Parsed from the source with ``ast``
(imports inside functions included), not from what happens to be imported at run time."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dualview"

# lowest first; a module may import only from layers before its own (and from the package root)
LAYERS = [
    ["download", "glue"],
    ["data", "stats", "train"],
    ["nets", "splits", "scoreboard"],
    ["gates", "zoo"],
    ["attention"],
    ["surrogates", "metrics"],
    ["paths"],
    ["architectures"],
    ["dgn"],
    ["npk_fc", "receptive_fields"],
    ["ntk", "npk_conv", "npk_resnet", "hyperplanes", "pullbacks", "projections", "leveling"],
    ["npk", "levels", "explain"],
    ["plot", "sweep", "exercises"],
]


def _module_level(tree: ast.AST):
    """The nodes of a module outside its function bodies."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _top(path: Path) -> str:
    """The library module a file belongs to: ``gates`` for ``gates/guard.py`` (a package is one module of the
    layers, its files may import each other), ``paths`` for ``paths.py``."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _is_module(name: str) -> bool:
    return (SRC / f"{name}.py").exists() or (SRC / name / "__init__.py").exists()


def imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        found = set()
        tree = ast.parse(path.read_text())
        # the package root may import inside a function (run on call, not on `import dualview`)
        nodes = _module_level(tree) if path.parent == SRC and path.stem == "__init__" else ast.walk(tree)
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dualview"):
                parts = node.module.split(".")
                if len(parts) > 1:
                    found.add(parts[1])
                else:  # from dualview import x: x is a module, or a name of the package root
                    found |= {a.name for a in node.names if _is_module(a.name)}
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dualview.")}
        graph.setdefault(_top(path), set()).update(found - {_top(path)})
    return graph


def test_every_module_has_a_layer():
    modules = {_top(p) for p in SRC.rglob("*.py")} - {"__init__"}
    listed = [m for layer in LAYERS for m in layer]
    assert sorted(listed) == sorted(modules), "add new modules to LAYERS (and to the README's layout)"


def test_imports_go_down_the_layers_so_there_is_no_cycle():
    level = {m: k for k, layer in enumerate(LAYERS) for m in layer}
    graph = imports()
    assert graph["__init__"] == set(), "the package root imports no module (importing dualview stays cheap)"
    upward = [(m, dep) for m, deps in graph.items() if m != "__init__" for dep in deps if level[dep] >= level[m]]
    assert not upward, f"imports that do not go down the layers: {upward}"


def test_the_parser_sees_a_cycle(tmp_path, monkeypatch):
    # the parser is not blind: two modules importing each other show up as a cycle in the graph
    (tmp_path / "gates.py").write_text("from dualview.plot import heatmap\n")
    (tmp_path / "plot.py").write_text("from dualview import gates\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    graph = imports()
    assert graph == {"gates": {"plot"}, "plot": {"gates"}}


def test_no_module_imports_a_private_name_of_another():
    private = []  # (the files of one package share their plumbing)
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dualview") and \
                    (node.module.split(".") + [""])[1] != _top(path):
                private += [(_top(path), node.module, a.name) for a in node.names if a.name.startswith("_")]
    assert not private, f"private names imported across modules (make them public or move them): {private}"


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"modules over 500 lines (split them by concept): {long}"
