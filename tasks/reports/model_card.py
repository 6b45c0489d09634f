"""``MODEL_CARD.md`` of a bundle: what the model is, its data, metrics against the baselines, the
gate checks, the verdict thresholds ``predict`` serves, the lineage and how to call it."""

from __future__ import annotations

import json
from typing import Any

from tasks.gates.candidates import candidate_rows
from tasks.params.schema import PipelineConfig


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
    """The card's Markdown from the bundle's facts (``bundle.json`` less its file hashes),
    ``evaluate.json``, ``gate.json``, the model's ``hydra.json`` and ``compiled.json``."""
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
    shipped = facts.get("candidate", "hydra")
    ships = (
        []
        if shipped == "hydra"
        else [
            f"**This bundle ships `{shipped}`, not the Hydra**: it passed the same gate checks "
            "and is the cheapest candidate `promote.candidates` allows. `predict` answers with "
            f"it (`answered_by` names it; the columns it cannot give are null, and "
            "`unavailable` says why). The Hydra below is the model it was judged beside.",
            "",
        ]
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
            f"# Model card: {name} ({'Hydra Ensemble' if shipped == 'hydra' else shipped})",
            "",
            *ships,
            f"A Hydra Ensemble of M = {arch['num_members']} members cut from one fine-tuned "
            f"`{arch.get('family', cfg.family)}` model by pruning different attention heads "
            f"({cfg.scoring.method} head scoring, {cfg.members.num_members} members, "
            f"{cfg.shared_layers} shared unpruned layers), merged into one network: one forward "
            "pass gives every member's prediction. Probabilities are the mean of the members' "
            f"softmax, temperature-scaled (T = {hydra_cfg['temperature']:.4f}, fitted on "
            "validation).",
            "",
            f"Gate verdict: **{gate['verdict'].upper()}**. Shipped artifact: "
            f"{compiled['backend']} ({compiled.get('precision', '-')} on "
            f"{compiled.get('device', '-')}); `predict` falls back to the eager model where that "
            "backend does not run. Precisions the stages resolved (`runtime.precision`; pin one "
            "with `--set runtime.precision=fp32` to reproduce a version elsewhere): "
            f"`{json.dumps(hydra_cfg.get('metadata', {}).get('precisions'), sort_keys=True)}`.",
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
            f"Checks of `{gate.get('candidate', 'hydra')}`:",
            "",
            "\n".join(checks),
            "",
            "## Candidates",
            "Every model this run built, judged by the same checks (a check that does not apply "
            "to a candidate says why in `gate.json`), with its cost measured in one process "
            "beside the others (`metrics/cost.json`):",
            "",
            "\n".join(candidate_rows(gate)),
            "",
            "## Verdicts served by predict",
            f"OOD score `{thresholds.get('score', '-')}` (higher = more likely OOD): `uncertain` "
            f"above {_f(thresholds.get('uncertain'))}, `likely OOD` above "
            f"{_f(thresholds.get('likely_ood'))} (quantiles of the ID validation scores)."
            if thresholds
            else "None: this model stores no verdict thresholds, so `predict`'s `verdict` is "
            "null (`unavailable` says why).",
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
