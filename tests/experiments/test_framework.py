"""`experiments.framework` as a whole: it imports no experiment and loads none by name, and its
modules import each other without a cycle. Each module has its own test (`test_<module>.py`
here, or the line of tests/README.md that says where it is tested)."""

from __future__ import annotations

import ast
import pathlib


def test_the_framework_imports_no_experiment_and_no_module_of_it_imports_itself_back():
  """`experiments.framework` imports, of `experiments`, only itself, and loads no module by name
  (`importlib`: experiments are found through `experiments.registry`); its modules import each
  other without a cycle, at the top of a module or inside its functions."""
  folder = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "framework"
  names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
  graph = {}
  for name in names:
    source = (folder / f"{name}.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and node.module:
        imported |= {f"{node.module}.{alias.name}" for alias in node.names}
      elif isinstance(node, ast.Import):
        imported |= {alias.name for alias in node.names}
    outside = {module for module in imported if module.split(".")[0] == "experiments"
               and not module.startswith("experiments.framework.")}
    assert not outside, (name, outside)
    assert "import_module" not in source and "__import__" not in source, name
    graph[name] = {module.split(".")[2] for module in imported
                   if module.startswith("experiments.framework.")} & names
  done: set = set()
  while len(done) < len(graph):  # peel off the modules whose imports are all peeled off
    ready = {name for name, needs in graph.items() if name not in done and needs <= done}
    assert ready, f"an import cycle among {sorted(set(graph) - done)}"
    done |= ready
