"""No import cycle inside jaxoff/, counting the imports inside functions.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` anywhere in a module, at the top level or inside a function, is an edge
from that module to the module it names. Relative imports are resolved against the importing
module's package; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module of
the tree (a submodule), to ``pkg`` otherwise. Importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``, but those edges are left out: the package ``__init__`` files here are lazy
or plain re-exports, and counting them would make every submodule that imports a sibling
through its package look circular. Imports under ``if TYPE_CHECKING:`` are left out too: they
never run (the top-level ``jaxoff`` imports its whole public API there, for type checkers
only; at run time it is lazy). A cycle is then a strongly connected component of more than one
module (or a module importing itself), and the test names each one, with one loop through it,
so a failure says which files to untangle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxoff"


def _modules(package=PACKAGE):
    """{dotted module name: source path} for every .py file under ``package``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _resolve(module, is_package, level, name):
    """The absolute module a relative ``from`` names (``level`` dots, then ``name``)."""
    if level == 0:
        return name
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _nearest(name, modules):
    """``name`` if it is a module of the tree, else its longest prefix that is, else None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (never run)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


def import_graph(package=PACKAGE):
    """{module: {module it imports}} over the modules of ``package``, function-level included."""
    modules = _modules(package)
    graph = {}
    for module, (path, is_package) in modules.items():
        edges = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _nearest(alias.name, modules)
                    if target:
                        edges.add(target)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, is_package, node.level, node.module)
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    target = submodule if submodule in modules else _nearest(source, modules)
                    if target:
                        edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph):
    """The strongly connected components with a cycle, each as a sorted list (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(start):
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter[0]
                    counter[0] += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _loop(graph, component):
    """One closed path through ``component``, as 'a -> b -> a' (shortest from its first member)."""
    members = set(component)
    start = component[0]
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return " -> ".join(reversed(path)) + f" -> {start}"
                if succ not in previous:
                    previous[succ] = node
                    following.append(succ)
        frontier = following
    return start


def test_no_import_cycle_inside_jaxoff():
    graph = import_graph()
    found = cycles(graph)
    report = "\n".join(
        f"  {', '.join(component)}\n    e.g. {_loop(graph, component)}" for component in found
    )
    assert not found, f"{len(found)} import cycle(s) inside jaxoff/:\n{report}"


def _graph_of(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path / "pkg")


def test_the_graph_counts_function_level_relative_and_submodule_imports(tmp_path):
    graph = _graph_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "def f():\n    from .sub import b\n",
            "sub/__init__.py": "",
            "sub/b.py": "from .. import c\n",
            "c.py": "import pkg.a\nfrom pkg.sub.b import thing\n",
            "d.py": "from pkg import a, sub\nfrom os import path\n",
        },
    )
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub.b"}
    assert graph["pkg.d"] == {"pkg.a", "pkg.sub"}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert _loop(graph, found[0]) == "pkg.a -> pkg.sub.b -> pkg.c -> pkg.a"


def test_a_name_imported_from_a_package_is_an_edge_to_the_package(tmp_path):
    graph = _graph_of(
        tmp_path,
        {
            "__init__.py": "from .x import helper\n",
            "x.py": "def helper():\n    from . import helper as h\n",
        },
    )
    # `from . import helper` names no submodule: the edge goes to the package itself
    assert graph["pkg.x"] == {"pkg"}
    assert cycles(graph) == [["pkg", "pkg.x"]]
