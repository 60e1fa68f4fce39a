"""The library's import graph, read from the source with `ast` (imports at the top of a module
and inside its functions alike): no cycle among `tfcl_jax` modules, and no import of the
repository's experiments, benchmarks or tests."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tfcl_jax"
OUTSIDE = ("experiments", "benchmarks", "tests")


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
  """`{dotted name: (file, is a package)}` of every module under `tfcl_jax`."""
  found = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
  return found


def _imported(name: str, path: pathlib.Path, is_package: bool) -> set[str]:
  """Every module name an import statement of the file names, anywhere in it.

  `from P import x` names `P.x` (`_graph` reads it as the deepest module in it: `P.x` when
  that is a module, else `P`); relative imports are resolved against the module's package.
  """
  names = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
      names.update(f"{base}.{alias.name}" for alias in node.names)
  return names


def _graph() -> dict[str, set[str]]:
  """`{module: the tfcl_jax modules it imports}`."""
  modules = _modules()
  graph = {}
  for name, (path, is_package) in modules.items():
    targets = set()
    for imported in _imported(name, path, is_package):
      # The deepest module of the name: `tfcl_jax.losses.info_nce` is `tfcl_jax.losses`.
      parts = imported.split(".")
      while parts and ".".join(parts) not in modules:
        parts.pop()
      if parts:
        targets.add(".".join(parts))
    graph[name] = targets - {name}
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, components = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in sorted(graph[node]):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        components.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return components


def test_the_graph_is_read():
  graph = _graph()
  assert "tfcl_jax.losses.spec" in graph["tfcl_jax.losses"]
  assert "tfcl_jax.losses._loss" in graph["tfcl_jax.losses.spec"]
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_library_modules():
  assert _cycles(_graph()) == []


def test_the_library_imports_no_experiment_benchmark_or_test():
  offending = []
  for name, (path, is_package) in _modules().items():
    for imported in _imported(name, path, is_package):
      if imported.split(".")[0] in OUTSIDE:
        offending.append(f"{name} imports {imported}")
  assert offending == []
