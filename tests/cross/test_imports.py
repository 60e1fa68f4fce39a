"""The library's import graph, read from the source with `ast` (imports at the top of a module
and inside its functions alike): no cycle among `tfcl_jax` modules, no import of the
repository's experiments, benchmarks or tests, and no import of another package's private
module or name (`tfcl_jax.<package>._x` from outside `<package>`; the benchmarks may reach into
the losses' internals, each such import saying why on its line)."""

from __future__ import annotations

import ast
import pathlib
import re

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


def _private_owner(imported: str) -> str | None:
  """The package whose private module or name `imported` names (`tfcl_jax.mappings` for
  `tfcl_jax.mappings._base.Mapping`: the first `_x` part's parent), or None for a public one."""
  parts = imported.split(".")
  for index, part in enumerate(parts[1:], start=1):
    if part.startswith("_") and not part.startswith("__"):
      return ".".join(parts[:index])
  return None


def _crossings(name: str, path: pathlib.Path, is_package: bool) -> list[str]:
  """The imports of `tfcl_jax` privates of the file that reach outside their package."""
  package = name if is_package else name.rpartition(".")[0]
  return [imported for imported in sorted(_imported(name, path, is_package))
          if imported.startswith("tfcl_jax.") and (owner := _private_owner(imported)) is not None
          and not (package == owner or package.startswith(owner + "."))]


def test_no_library_module_imports_another_packages_privates():
  crossings = [f"{name} imports {imported}" for name, (path, is_package) in _modules().items()
               for imported in _crossings(name, path, is_package)]
  assert crossings == [], "make the name public in its package, or move the code to it"


def test_a_crossing_is_found():
  assert _private_owner("tfcl_jax.mappings._batch_scaled.BatchScaled") == "tfcl_jax.mappings"
  assert _private_owner("tfcl_jax.losses._engine._tiles.Side") == "tfcl_jax.losses"
  assert _private_owner("tfcl_jax._checks.one_of") == "tfcl_jax"
  assert _private_owner("tfcl_jax.mappings.BatchScaled") is None
  module = ROOT / "tfcl_jax" / "losses" / "_info_nce.py"
  assert _crossings("tfcl_jax.losses._info_nce", module, False) == []
  # The same file read as a module of another package: every private import crosses.
  crossings = _crossings("tfcl_jax.analysis.pattern", module, False)
  assert "tfcl_jax.losses._engine._batch" in crossings and "tfcl_jax.losses._family.family" in (
      crossings)
  assert all(imported.startswith("tfcl_jax.losses._") for imported in crossings)


def test_the_benchmarks_say_why_they_reach_into_the_library():
  unexplained = []
  for path in sorted((ROOT / "benchmarks").rglob("*.py")):
    for number, line in enumerate(path.read_text().splitlines(), start=1):
      reaches = re.match(r"\s*(from|import) tfcl_jax\S*\._[a-z]|\s*from tfcl_jax\S* import _[a-z]",
                         line)
      if reaches and "#" not in line:
        unexplained.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
  assert unexplained == [], "say on the line why the benchmark needs the private module"
