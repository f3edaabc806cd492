"""The SDK's modules import one way: no module reaches back to one that imports it, not even
for type hints only (``if TYPE_CHECKING``) or inside a function."""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "warren"


def _graph():
    graph = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        mod = ".".join(rel.parts)
        if mod.endswith("__init__"):
            continue  # the package's front door re-exports everything
        pkg = rel.parts[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = list(pkg[: len(pkg) - (node.level - 1)])
                if node.module:
                    base += node.module.split(".")
                target = ".".join(base)
                if target and not target.endswith("__init__"):
                    deps.add(target)
        graph[mod] = deps
    return graph


def _cycle(graph):
    state = {}
    stack = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in graph:
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_sdk_modules_have_no_import_cycle():
    graph = _graph()
    assert "_sandboxes" in graph and "_exec" in graph, sorted(graph)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
