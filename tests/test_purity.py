"""hydra_ops is a pure PyTorch library: importing all of it must not import Prefect or DVC."""

import subprocess
import sys


def test_hydra_ops_imports_neither_prefect_nor_dvc():
    code = (
        "import importlib, pkgutil, sys\n"
        "import hydra_ops\n"
        "for info in pkgutil.walk_packages(hydra_ops.__path__, 'hydra_ops.'):\n"
        "    importlib.import_module(info.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'prefect', 'dvc', 'gto'})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_imports_point_one_way():
    """tasks may import hydra_ops, flows may import tasks; never the other way round."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
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
