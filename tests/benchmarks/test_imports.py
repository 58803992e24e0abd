"""Every import in the package and the benchmarks resolves, including those inside functions (the benchmarks import lazily, so a moved
name would otherwise surface only when a benchmark is run by hand)."""
import ast
import importlib
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = sorted(p for d in ("sunnypilot", "benchmarks") for p in (ROOT / d).rglob("*.py"))

def project_imports(path: pathlib.Path) -> list[tuple[int, str, str]]:
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("sunnypilot", "benchmarks"):
      out += [(node.lineno, node.module, a.name) for a in node.names]
  return out

@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_resolve(path: pathlib.Path):
  missing = []
  for line, module, name in project_imports(path):
    try:
      mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
      missing.append(f"line {line}: {module} ({e})")
      continue
    if not hasattr(mod, name) and importlib.util.find_spec(f"{module}.{name}") is None:
      missing.append(f"line {line}: {module}.{name}")
  assert not missing, missing
