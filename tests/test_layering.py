"""The layers keep to their imports: the engine knows no web code, the catalogue no torch, the identities neither."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.support.fresh import call_fresh

REPO = Path(__file__).resolve().parent.parent
CHECK = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
loaded = set(sys.modules) | {{m.split('.')[0] for m in sys.modules}}
print(json.dumps(sorted(loaded & set({forbidden!r}))))
"""
WEB = ["gradio", "gradio_client", "starlette", "fastapi", "spaces", "uvicorn", "serving", "app"]


def _modules(package: str) -> list[str]:
    """Every module of `package`, its sub-packages' included (by file, so nothing is imported to list them)."""
    names = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _imported(modules: list[str], forbidden: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(modules=modules, forbidden=forbidden)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_engine_pulls_in_no_web_or_space_code():
    assert _imported(["engine"], WEB) == []


def test_no_engine_module_imports_web_space_or_cli_code():
    # One process for all: if none is imported with every engine module loaded, no single module imports one.
    modules = _modules("engine")
    assert len(modules) > 30 and "engine.pools.engine" in modules
    assert _imported(modules, [*WEB, "lora_catalog.__main__"]) == []


def _static_imports(name: str, path: Path, known: set[str], *, typing: bool = False) -> set[str]:
    """The project modules `name` imports anywhere in its file (functions included), less those imported only
    for type checking (`if TYPE_CHECKING:`), which never run, unless `typing` (a layer they still lean on)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if not typing and isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for node in ast.walk(block)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def _graph(packages: tuple[str, ...], *, typing: bool = False) -> dict[str, set[str]]:
    """Each module of `packages` (and `app`) to the project modules it imports, parsed in a fresh interpreter
    (tests/support/fresh.py says why)."""
    graph = call_fresh("tests.test_layering", "graph_here", list(packages), typing)
    return {m: set(imported) for m, imported in graph.items()}


def graph_here(packages: list[str], typing: bool) -> dict[str, set[str]]:
    """`_graph`, parsed in this process."""
    paths = {m: REPO / (m.replace(".", "/") + ".py") for p in packages for m in _modules(p)}
    paths = {m: p if p.exists() else p.with_suffix("") / "__init__.py" for m, p in paths.items()}
    paths["app"] = REPO / "app.py"
    return {m: _static_imports(m, p, set(paths), typing=typing) for m, p in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            child = next((m for m in edges if m not in index or m in stack), None)
            if child is not None:
                if child in index:
                    low[node] = min(low[node], index[child])
                else:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(group) > 1:
                    found.append(sorted(group))
    return found


# The layers, lowest first: a module imports only its own layer's and those below.
LAYERS = ("families", "lora_catalog", "engine", "serving", "app")


def test_the_import_graph_has_no_circle_even_through_type_only_imports():
    graph = _graph(LAYERS[:-1], typing=True)
    assert len(graph) > 100 and "engine.models" in graph
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_a_layer_above_its_own():
    graph = _graph(LAYERS[:-1], typing=True)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(
        f"{a} -> {b}"
        for a, imported in graph.items()
        for b in imported
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]
    )
    assert upward == []


def test_no_two_modules_import_each_other():
    """A pair that imports each other has no layer between them: one of them holds what both need."""
    graph = _graph(("families", "engine", "serving", "lora_catalog", "bench"))
    assert len(graph) > 100
    mutual = sorted({tuple(sorted((a, b))) for a, imported in graph.items() for b in imported if a in graph[b]})
    assert mutual == []


def test_the_families_identities_import_no_torch_engine_catalogue_or_web_code():
    # Both the catalogue and the engine read each family's identity, so it may import neither (nor torch).
    modules = _modules("families")
    assert "families.sdxl" in modules and "families.identity" in modules
    assert _imported(modules, ["torch", "diffusers", "transformers", "engine", "lora_catalog", *WEB]) == []


def test_no_module_over_400_lines_and_no_function_over_60():
    """Modules stay readable in one sitting, functions on one screen (docs/internals.md, the developers' rules)."""
    assert call_fresh("tests.test_layering", "long_parts") == [[], []]


def long_parts() -> tuple[list[str], list[str]]:
    """The modules over 400 lines and the functions over 60, parsed in this process."""
    long_modules: list[str] = []
    long_functions: list[str] = []
    for package in ("engine", "serving", "lora_catalog", "families"):
        for path in sorted((REPO / package).rglob("*.py")):
            source = path.read_text()
            if source.count("\n") > 400:
                long_modules.append(f"{path.relative_to(REPO)} ({source.count(chr(10))})")
            long_functions.extend(
                f"{path.relative_to(REPO)}:{node.name}"
                for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and (node.end_lineno or node.lineno) - node.lineno + 1 > 60
            )
    return long_modules, long_functions
