"""hydra_ops is a pure PyTorch library: importing all of it must not import the pipeline's tools
(Prefect, DVC, GTO) nor its params machinery (pydantic, YAML)."""

import subprocess
import sys


def test_hydra_ops_imports_no_pipeline_tool_nor_params_machinery():
    code = (
        "import importlib, pkgutil, sys\n"
        "import hydra_ops\n"
        "for info in pkgutil.walk_packages(hydra_ops.__path__, 'hydra_ops.'):\n"
        "    importlib.import_module(info.name)\n"
        "banned = {'prefect', 'dvc', 'gto', 'pydantic'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in banned)\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_hydra_ops_source_imports_no_params_machinery():
    """No module of hydra_ops imports pydantic or yaml itself (transformers imports yaml on its
    own, so this reads the source rather than ``sys.modules``)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "hydra_ops"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"pydantic", "yaml"}]
    assert found == []


def test_imports_point_one_way():
    """tasks may import hydra_ops, flows may import tasks; never the other way round."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for package, forbidden in (("hydra_ops", ("tasks", "flows")), ("tasks", ("flows",))):
        for path in (root / package).rglob("*.py"):
            for line in path.read_text().splitlines():
                stripped = line.strip()
                if any(
                    stripped.startswith(f"from {name}") or stripped.startswith(f"import {name}")
                    for name in forbidden
                ):
                    offenders.append(f"{path.relative_to(root)}: {stripped}")
    assert offenders == []
