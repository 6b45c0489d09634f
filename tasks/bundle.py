"""Stage ``bundle``: the one folder that ships, and loading it back to serve predictions.

``models/bundle`` (DVC-cached, what ``promote`` registers)::

    model/        the calibrated model (models/hydra: model.safetensors + hydra.json; the
                  temperature and the OOD verdict thresholds are in hydra.json)
    compiled/     its compiled artifact (backend, precision, device, versions, the agreement
                  check in compiled.json; only compiled.json when the backend is eager)
    gate.json     the gate verdict, with the hashes of what it judged
    evaluate.json the metrics of Hydra and every baseline, with paired-bootstrap intervals
    MODEL_CARD.md what the model is, data, metrics vs baselines, gates, lineage, how to call it
    bundle.json   the sha256 of every file above, the verdict's hashes, the lineage

The stage refuses a verdict that does not match the workspace (it was written for another model,
evaluation or params). :func:`load_served` verifies every file against ``bundle.json`` (an edited
``hydra.json`` is refused like edited weights), then serves the compiled artifact when its backend
runs on this machine (checked at load: backend importable, device present, artifact loads) and the
eager model otherwise; ``Served.answered_by`` says which one answered.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hydra_ops.hashing import sha256_file
from tasks.common import (
    BUNDLE,
    COMPILED,
    DATA,
    HYDRA,
    METRICS,
    REPORTS,
    cached_outputs,
    publish_dir,
    read_json,
    stage_main,
    write_json,
    write_text,
)
from tasks.lineage import judged_hashes, stale_roles
from tasks.params import PipelineConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger("hydra_ens")

FORMAT = "hydra-ens-bundle/1"
MANIFEST = "bundle.json"
CARD = "MODEL_CARD.md"


def stale_verdict_message(stale: list[str], recorded: dict, current: dict) -> str:
    """One line: which judged artifacts changed since the verdict, and what to run."""
    parts = [
        f"{current[r]['path']} ({str((recorded.get(r) or {}).get('md5'))[:8]} -> "
        f"{current[r]['md5'][:8]})"
        for r in stale
    ]
    return (
        "the gate verdict (reports/gate.json) is stale: changed since it was written: "
        + ", ".join(parts)
        + "; rerun the gate on what is there now: hydra-ens run (or dvc repro gate)"
    )


def _lineage(root: Path) -> dict[str, Any]:
    """Every cached output's md5 from ``dvc.lock`` (what the bundle was built from)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
    cached = cached_outputs(root)  # uncached metrics hold run facts (timings)
    return {
        out["path"]: out.get("md5")
        for stage in stages.values()
        for out in stage.get("outs") or []
        if out.get("md5") and out["path"] in cached
    }


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    gate = read_json(root / REPORTS / "gate.json", "gate output")
    recorded = gate.get("judged")
    current = judged_hashes(cfg, root)
    if not recorded:
        raise ValueError("reports/gate.json records nothing it judged; rerun: dvc repro gate")
    if stale := stale_roles(recorded, current):
        raise ValueError(stale_verdict_message(stale, recorded, current))
    ev = read_json(root / METRICS / "evaluate.json", "evaluate output")
    # the facts the card needs; the format is checked where the model is loaded (load_hydra)
    hydra_cfg = read_json(root / HYDRA / "hydra.json", "calibrated model")
    compiled = read_json(root / COMPILED / "compiled.json", "compile output")
    data_manifest = root / DATA / "manifest.json"
    with publish_dir(root / BUNDLE) as tmp:
        shutil.copytree(root / HYDRA, tmp / "model")
        shutil.copytree(root / COMPILED, tmp / "compiled")
        write_json(tmp / "gate.json", gate)
        write_json(tmp / "evaluate.json", ev)
        facts = {
            "model_name": cfg.promote.model_name,
            "verdict": gate["verdict"],
            "judged": recorded,
            "temperature": hydra_cfg["temperature"],
            "ood_thresholds": hydra_cfg.get("metadata", {}).get("ood_thresholds"),
            "compiled_backend": compiled["backend"],
            "data_manifest_sha256": sha256_file(data_manifest) if data_manifest.is_file() else None,
            "lineage": _lineage(root),
        }
        write_text(tmp / CARD, render_card(cfg, facts, ev, gate, hydra_cfg, compiled))
        files = {
            p.relative_to(tmp).as_posix(): sha256_file(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        write_json(tmp / MANIFEST, {"format": FORMAT, **facts, "files": files})
    log.info(
        "bundle: %s (%d files, gate %s, compiled backend %s)",
        BUNDLE,
        len(files) + 1,
        gate["verdict"],
        compiled["backend"],
    )
    return facts


# ---- the model card ----
def _f(v: Any, fmt: str = ".4f") -> str:
    return "-" if v is None else format(v, fmt)


def render_card(
    cfg: PipelineConfig,
    facts: dict[str, Any],
    ev: dict[str, Any],
    gate: dict[str, Any],
    hydra_cfg: dict[str, Any],
    compiled: dict[str, Any],
) -> str:
    arch = hydra_cfg["architecture"]
    cols = [
        ("id_test", "accuracy"),
        ("id_test", "nll"),
        ("id_test", "ece"),
        ("shift", "accuracy"),
        ("near_ood", "auroc"),
        ("far_ood", "auroc"),
    ]
    rows = [
        "| model | " + " | ".join(f"{s}.{m}" for s, m in cols) + " | T | parameters |",
        "|---" * (len(cols) + 3) + "|",
    ]
    for name, entry in ev["models"].items():
        values = " | ".join(_f(entry["calibrated"][s][m]) for s, m in cols)
        rows.append(f"| {name} | {values} | {entry['temperature']:.3f} | {entry['parameters']:,} |")
    diffs = ["| baseline | metric | Hydra - baseline | 95% interval |", "|---|---|---|---|"]
    for base, by_variant in ev.get("bootstrap", {}).items():
        for split, by_metric in by_variant["calibrated"].items():
            for metric, r in by_metric.items():
                diffs.append(
                    f"| {base} | {split}.{metric} | {r['difference']:+.4f} | "
                    f"[{r['low']:+.4f}, {r['high']:+.4f}] |"
                )
    checks = ["| check | status | value | rule or note |", "|---|---|---|---|"]
    for c in gate["checks"]:
        checks.append(
            f"| {c['name']} | {c['status']} | {_f(c.get('value'))} | "
            f"{c.get('rule', c.get('note', ''))} |"
        )
    thresholds = facts["ood_thresholds"] or {}
    lineage = [f"- `{path}`: `{md5}`" for path, md5 in facts["lineage"].items()]
    judged = [f"- {role}: `{r['path']}` `{r['md5']}`" for role, r in facts["judged"].items()]
    name = facts["model_name"]
    return "\n".join(
        [
            f"# Model card: {name} (Hydra Ensemble)",
            "",
            f"A Hydra Ensemble of M = {arch['num_members']} members cut from one fine-tuned "
            f"`{arch.get('family', cfg.family)}` model by pruning different attention heads "
            f"({cfg.scoring.method} head scoring, {cfg.members.num_members} members, "
            f"{cfg.shared_layers} shared unpruned layers), merged into one network: one forward "
            "pass gives every member's prediction. Probabilities are the mean of the members' "
            f"softmax, temperature-scaled (T = {facts['temperature']:.4f}, fitted on validation).",
            "",
            f"Gate verdict: **{gate['verdict'].upper()}**. Shipped artifact: "
            f"{compiled['backend']} ({compiled.get('precision', '-')} on "
            f"{compiled.get('device', '-')}); `predict` falls back to the eager model where that "
            "backend does not run.",
            "",
            "## Data",
            f"Source `{cfg.data.name}`; classes {', '.join(arch.get('class_names') or [])}; "
            "examples per split "
            + ", ".join(f"{k} {v}" for k, v in ev.get("counts", {}).items())
            + f". Manifest sha256 `{facts['data_manifest_sha256']}`.",
            "",
            "## Metrics (test splits, calibrated)",
            "\n".join(rows),
            "",
            "Paired bootstrap, Hydra minus each baseline:",
            "",
            "\n".join(diffs),
            "",
            "## Gates",
            "\n".join(checks),
            "",
            "## Verdicts served by predict",
            f"OOD score `{thresholds.get('score', '-')}` (higher = more likely OOD): `uncertain` "
            f"above {_f(thresholds.get('uncertain'))}, `likely OOD` above "
            f"{_f(thresholds.get('likely_ood'))} (quantiles of the ID validation scores).",
            "",
            "## Lineage",
            "The verdict judged (DVC md5):",
            *judged,
            "",
            "Built from (dvc.lock):",
            *lineage,
            "",
            "## Use",
            "```",
            f"hydra-ens predict 'a text to classify'   # the {name} model in prod",
            "hydra-ens predict --json 'a text'        # one JSON object per input",
            "hydra-ens registry                       # versions, stages, verdicts",
            "```",
            "",
        ]
    )


# ---- serving ----
@dataclass
class Served:
    """A verified bundle ready to answer: ``member_logits(batch) -> [B, M, C]``."""

    directory: Path
    hydra: Any
    metadata: dict[str, Any]
    answered_by: str
    _compiled: Callable[[dict], torch.Tensor] | None = field(default=None, repr=False)

    def member_logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        from hydra_ops.compile import arrange_inputs, input_names_of

        with torch.no_grad():
            if self._compiled is not None:
                try:
                    return self._compiled(batch).float()
                except Exception as err:  # a backend that loaded but cannot run here
                    # the eager model is the gated one (its hashes were verified on load), so it
                    # answers instead; every prediction says so, and the log says why
                    log.warning(
                        "compiled artifact failed here, eager answers: %s: %s",
                        type(err).__name__,
                        err,
                    )
                    self.answered_by = (
                        f"eager (compiled artifact failed here: {type(err).__name__})"
                    )
                    self._compiled = None
            self.hydra.eval()
            return self.hydra(*arrange_inputs(batch, input_names_of(batch))).float()


#: The files ``load_hydra`` hashes itself against the manifest (``expected_*_sha256``).
MODEL_FILES = ("model/hydra.json", "model/model.safetensors")


def verify_bundle(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``bundle.json`` after checking every file it lists but ``skip`` (ValueError naming the
    first change)."""
    manifest = read_json(directory / MANIFEST, "bundle")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory / MANIFEST}: format must be {FORMAT!r}")
    for rel, digest in manifest["files"].items():
        if rel in skip:
            continue
        path = directory / rel
        if not path.is_file():
            raise ValueError(f"bundle {directory}: {rel} is missing")
        if sha256_file(path) != digest:
            raise ValueError(f"bundle {directory}: {rel} was modified (sha256 does not match)")
    return manifest


def _compiled_runner(directory: Path) -> tuple[Callable[[dict], torch.Tensor] | None, str]:
    """The compiled artifact when it runs on this machine, else ``(None, why not)``."""
    import torch

    from hydra_ops.compile import available_backends, load_compiled

    meta = read_json(directory / "compiled.json", "compiled artifact")
    backend = meta["backend"]
    if backend == "eager":
        return None, "eager (no compiled artifact)"
    why = available_backends().get(backend, f"unknown backend {backend!r}")
    if why is None and str(meta.get("device", "cpu")).startswith("cuda"):
        why = None if torch.cuda.is_available() else "no CUDA device here"
    if why is not None:
        return None, f"eager (compiled {backend} does not run here: {why})"
    try:
        artifact = load_compiled(directory)
    except Exception as err:
        return None, f"eager (compiled {backend} did not load: {type(err).__name__}: {err})"
    return artifact, f"compiled {backend} ({meta.get('precision', '?')} on {artifact.device})"


def load_served(directory: Path, prefer_compiled: bool = True) -> Served:
    """Verify and load a bundle (see the module docstring)."""
    from hydra_ops.serialization import load_hydra, read_hydra_config

    directory = Path(directory)
    manifest = verify_bundle(directory, skip=MODEL_FILES)  # load_hydra checks those two
    hydra = load_hydra(
        directory / "model",
        expected_config_sha256=manifest["files"]["model/hydra.json"],
        expected_weights_sha256=manifest["files"]["model/model.safetensors"],
    )
    metadata = dict(read_hydra_config(directory / "model").get("metadata", {}))
    runner, answered_by = (None, "eager (requested)")
    if prefer_compiled:
        runner, answered_by = _compiled_runner(directory / "compiled")
    return Served(directory, hydra, metadata, answered_by, runner)


def main() -> None:
    stage_main("bundle", run)


if __name__ == "__main__":
    main()
