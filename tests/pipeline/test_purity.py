"""hydra_ops is a pure PyTorch library: importing all of it must not import the pipeline's tools
(Prefect, DVC, GTO) nor its params machinery (pydantic, YAML). Every stage is a process, so what
a stage imports is time spent on every run: no torch where no model runs, and a model family's
library (transformers, timm) only with a model of that family."""

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


def _imported_after(code: str, env: dict | None = None) -> set[str]:
    """Top-level packages in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    import os

    probe = f"{code}\nimport sys\nprint(','.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.strip().splitlines()[-1].split(","))


def test_stages_that_run_no_model_import_no_torch():
    """Each stage is a process: gate, bundle and promote start in well under a second because
    neither they nor the params machinery import torch (2-3 s), and a family's library is imported
    only with a model of that family."""
    found = _imported_after(
        "import tasks.gate, tasks.bundle, tasks.promote, tasks.select_members\n"
        "import tasks.runtime.stage\n"
        "tasks.runtime.stage.set_threads()"
    )
    assert "torch" not in found and "tasks" in found
    found = _imported_after(
        "import hydra_ops.adapters, hydra_ops.hydra.serialization, hydra_ops.scoring"
    )
    assert "torch" in found
    assert not found & {"transformers", "timm", "torchmetrics"}, found


def test_a_model_family_imports_only_its_own_library():
    found = _imported_after(
        "from timm.models.vision_transformer import VisionTransformer\n"
        "from hydra_ops.adapters import get_adapter\n"
        "vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4)\n"
        "assert get_adapter(vit).family == 'timm_vit'"
    )
    assert "timm" in found and "transformers" not in found, sorted(found)


def test_set_threads_reaches_torch_imported_after_it():
    code = (
        "from tasks.runtime.stage import set_threads\nset_threads()\nimport torch\n"
        "assert torch.get_num_threads() == 1, torch.get_num_threads()"
    )
    _imported_after(code, env={"HYDRA_ENS_THREADS": "1", "OMP_NUM_THREADS": "2"})
