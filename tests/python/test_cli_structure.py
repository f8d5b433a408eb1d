"""The CLI (python/dmuon/cli) apart from the library: no import cycle among its modules, it
imports only the library's public modules and names, and reaches no private attribute
except the torch and argparse internals listed here. Read from the source (ast), so it
needs no build."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "dmuon"
CLI = PACKAGE / "cli"

# The library's public modules the CLI may import (besides `dmuon`'s own exports).
PUBLIC_MODULES = {"dmuon", "dmuon.analysis"}
# Private attributes of torch and argparse the tools use knowingly (none of dmuon's).
TORCH_PRIVATE = {"_sleep", "_foreach_add_", "_foreach_lerp_", "_schema", "_get_fsdp_state", "_fsdp_param_group",
                 "_post_reduce_event", "_actions", "_SubParsersAction"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, str | None]]:
    """(module, name or None) of every import anywhere in the file (function bodies too),
    and of importlib.import_module("…") calls with a constant name."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
            out += [(base, alias.name) for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((node.args[0].value, None))
    return out


def _cli_files() -> dict[str, tuple[Path, ast.AST]]:
    files = {}
    for path in sorted(CLI.rglob("*.py")):
        files[_module_name(path)] = (path, ast.parse(path.read_text(), filename=str(path)))
    return files


def _dmuon_exports() -> set[str]:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("dmuon/__init__.py has no __all__")


def _graph() -> dict[str, set[str]]:
    """CLI module → the CLI modules it imports (a `from pkg import sub` names the submodule)."""
    graph: dict[str, set[str]] = {}
    for module, (path, tree) in _cli_files().items():
        edges = set()
        for base, name in _imports(tree, module, path.name == "__init__.py"):
            target = f"{base}.{name}" if name and _is_module(f"{base}.{name}") else base
            if target.startswith("dmuon.cli") and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_among_the_cli_modules():
    graph = _graph()
    assert "dmuon.cli.bench.e2e" in graph and graph["dmuon.cli.bench.e2e"], graph  # the graph is read
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cli_imports_only_the_librarys_public_modules_and_names():
    exports = _dmuon_exports() | {"analysis"}
    bad = []
    for module, (path, tree) in _cli_files().items():
        for base, name in _imports(tree, module, path.name == "__init__.py"):
            if not (base == "dmuon" or base.startswith("dmuon.")) or base.startswith("dmuon.cli"):
                continue
            if base not in PUBLIC_MODULES:
                bad.append(f"{path.relative_to(PACKAGE)}: {base}")
            elif base == "dmuon" and name is not None and name not in exports:
                bad.append(f"{path.relative_to(PACKAGE)}: dmuon.{name}")
    assert not bad, bad


def test_the_cli_reaches_no_private_attribute():
    bad = []
    for _, (path, tree) in _cli_files().items():
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                        and node.value.id in ("self", "cls")):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                name = node.args[1].value
            if name and name.startswith("_") and not name.startswith("__") and name not in TORCH_PRIVATE:
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}")
    assert not bad, bad
