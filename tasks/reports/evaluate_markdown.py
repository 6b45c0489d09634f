"""The Markdown of ``reports/evaluate.md``: metrics per model, paired-bootstrap intervals, OOD
detection under every OOD score, what the shipped artifact is, and how many examples each
``predict`` verdict flags."""

from __future__ import annotations

from typing import Any

from tasks.evaluation.member_diversity import diversity_section
from tasks.params.core import CoreConfig
from tasks.params.metrics import CLASSIFICATION_METRICS, OOD_METRICS

#: Baselines whose members run in one forward pass over the stacked batch (how, from the params).
ONE_PASS = {
    "batch_ensemble": lambda cfg: "one pass",
    "lora_ensemble": lambda cfg: (
        "one batched pass" if cfg.baselines.lora_ensemble.batched else "turn (one adapter each)"
    ),
}


def _fmt(v: float) -> str:
    return f"{v:.4f}" if abs(v) < 100 else f"{v:,.0f}"


def _precision(name: str | None) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name or "", name or "")


def latency_setup(
    cfg: CoreConfig,
    device: str,
    precision: str,
    models: dict[str, dict[str, Any]],
    compiled: dict[str, Any],
) -> dict[str, Any]:
    """What ``latency_ms`` timed, for the report: ``{batch, rounds, device, timed: {model: how},
    compiled: {backend, precision}}``. Every model runs in evaluate's process, in interleaved
    rounds (:mod:`tasks.evaluation.cost`), eager on ``device`` in the runtime's ``precision``,
    except Hydra, whose latency is what ships: its compiled artifact, or with ``compile.backend:
    eager`` the eager model at the precision it ships in (weights and inputs cast); a model of K
    independent members (Deep Ensemble, control) runs its K models in turn, MC Dropout its K passes,
    BatchEnsemble its K members in one pass over the stacked batch, LoRA-Ensemble likewise or one
    adapter at a time (``baselines.lora_ensemble.batched``)."""
    shipped = _precision(compiled.get("precision"))
    backend = compiled.get("backend")
    timed = {}
    for name, entry in models.items():
        if name == "hydra":
            if backend and backend != "eager":
                how = f"compiled {backend} {shipped or precision}"
            else:
                how = f"eager {shipped if shipped and shipped != 'fp32' else precision}"
            how += f", {entry['members']} members in one pass"
        else:
            how = f"eager {precision}"
            if name in ONE_PASS:
                how += f", {entry['members']} members in {ONE_PASS[name](cfg)}"
            elif entry["members"] > 1:
                unit = "passes" if name == "mc_dropout" else "models"
                how += f", {entry['members']} {unit} in turn"
        timed[name] = how
    return {
        "batch": cfg.evaluate.latency_batch,
        "rounds": cfg.evaluate.cost_rounds,
        "device": device,
        "timed": timed,
        "compiled": {"backend": compiled.get("backend"), "precision": shipped or None},
    }


def metrics_table(result: dict[str, Any], variant: str = "calibrated") -> str:
    """Markdown table: one row per model, columns split/metric (+ parameters, latency and, when
    ``result`` has :func:`latency_setup`'s ``latency_setup``, what the latency timed)."""
    cols = [("id_test", m) for m in CLASSIFICATION_METRICS]
    cols += [("shift", m) for m in ("accuracy", "nll", "ece")]
    cols += [(s, m) for s in ("near_ood", "far_ood") for m in OOD_METRICS]
    setup = result.get("latency_setup")
    header = ["model", *[f"{s}.{m}" for s, m in cols], "T", "parameters", "latency_ms"]
    if setup:
        header.append(f"latency timed (batch {setup['batch']})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in result["models"].items():
        row = [name] + [_fmt(entry[variant][s][m]) for s, m in cols]
        t = entry["temperature"] if variant == "calibrated" else 1.0
        latency = entry.get("latency_ms")
        shown = "-" if latency is None else f"{latency:.1f}"
        row += [f"{t:.3f}", f"{entry['parameters']:,}", shown]
        if setup:
            row.append(setup["timed"].get(name, "-"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def latency_note(setup: dict[str, Any]) -> str:
    """One paragraph: what ``latency_ms`` is, and what it is not (the compiled artifact)."""
    compiled = setup["compiled"]
    note = (
        f"`latency_ms`: the median of {setup['rounds']} interleaved timing rounds "
        "(`metrics/cost.json`) of one forward pass over a "
        f"batch of {setup['batch']} ID-test examples, on {setup['device']}, every model in "
        "the same process (column `latency timed`: how and at which precision). "
        "A figure measured on another machine, precision or batch (the README's, `benchmarks/`) "
        "does not compare with these."
    )
    precisions = {how.split(",")[0] for how in setup["timed"].values()}
    if len(precisions) > 1:
        note += (
            " The rows ran differently (" + ", ".join(sorted(precisions)) + "): the Hydra as it "
            "ships, the others eager at the runtime's precision, so a ratio between them also "
            "measures the backend and precision. `metrics/cost.json` compares like with like "
            "(the Hydra's eager model among the others, its shipped artifact apart)."
        )
    if compiled.get("backend") and compiled["backend"] != "eager":
        note += (
            f" The Hydra ships compiled ({compiled['backend']}, {compiled['precision']}): its "
            "row times that artifact."
        )
    return note


def ood_score_table(result: dict[str, Any]) -> str:
    """Markdown: per model and OOD split, AUROC / FPR@95%TPR (calibrated) under every OOD score
    of ``ood_by_score``; ``-`` where a score is undefined (ensemble-only scores, one member)."""
    kinds = list(next(iter(result["models"].values()))["ood_by_score"]["near_ood"])
    lines = [
        "| model | split | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name, entry in result["models"].items():
        for split, by_kind in entry["ood_by_score"].items():
            cells = [
                "-" if m is None else f"{m['auroc']:.4f} / {m['fpr_at_95_tpr']:.4f}"
                for m in (by_kind[k] for k in kinds)
            ]
            lines.append(f"| {name} | {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bootstrap_table(result: dict[str, Any], variant: str = "calibrated") -> str:
    lines = [
        "| baseline | split | metric | Hydra - baseline | 95% interval |",
        "|---|---|---|---|---|",
    ]
    for base, by_variant in result["bootstrap"].items():
        for split, by_metric in by_variant[variant].items():
            for metric, r in by_metric.items():
                lines.append(
                    f"| {base} | {split} | {metric} | {r['difference']:+.4f} | "
                    f"[{r['low']:+.4f}, {r['high']:+.4f}] |"
                )
    return "\n".join(lines)


def _compiled_note(hydra: dict[str, Any]) -> str:
    if hydra["compile_max_abs_diff"] is None:
        return "eager (nothing compiled; the compile checks are not applicable)"
    return (
        f"{hydra['compile_backend']} (max |dp| vs eager {hydra['compile_max_abs_diff']:.2e}, "
        f"argmax agreement {hydra['compile_argmax_agreement']:.4f})"
    )


def verdict_table(result: dict[str, Any]) -> str:
    """Markdown: per split, how many Hydra examples each ``hydra-ens predict`` verdict flags."""
    from hydra_ops.uq.ood_thresholds import VERDICT_LABELS, VERDICTS

    hydra = result["models"]["hydra"]
    lines = [
        "| split | n | " + " | ".join(VERDICT_LABELS[v] for v in VERDICTS) + " |",
        "|---|---|" + "---|" * len(VERDICTS),
    ]
    for split, counts in hydra["verdicts"].items():
        n = sum(counts.values())
        cells = [f"{counts[v]} ({hydra['verdict_fractions'][split][v]:.1%})" for v in VERDICTS]
        lines.append(f"| {split} | {n} | " + " | ".join(cells) + " |")
    th = result.get("verdict_thresholds")
    if th:
        lines.append(
            f"\nThresholds (from `models/hydra` metadata, fitted on {th['fitted_on']}, n = "
            f"{th['n']}): score `{th['score']}` (higher = more OOD); uncertain > "
            f"{th['uncertain']:.4g} (the {th['uncertain_quantile']:.0%} quantile of ID scores), "
            f"likely OOD > {th['likely_ood']:.4g} (the {th['likely_ood_quantile']:.0%} quantile)."
        )
    return "\n".join(lines)


def render_report(result: dict[str, Any]) -> str:
    hydra = result["models"]["hydra"]
    return (
        "\n\n".join(
            [
                f"# Evaluation: Hydra Ensemble ({result['variant']} variant, M = "
                f"{result['num_members']})",
                f"OOD score: `{result['ood_score']}` (OOD is the positive class). The scorer's OOD "
                f"validation set: {result['ood_validation_set']}. Examples per split: "
                + ", ".join(f"{k} {v}" for k, v in result["counts"].items())
                + f". Shipped artifact: {_compiled_note(hydra)}.",
                "## Calibrated (temperature scaling fitted on validation)",
                metrics_table(result, "calibrated"),
            ]
            + ([latency_note(result["latency_setup"])] if "latency_setup" in result else [])
            + [
                "## Raw",
                metrics_table(result, "raw"),
                "## Paired bootstrap: Hydra minus each baseline (calibrated)",
                bootstrap_table(result, "calibrated"),
            ]
            + (
                [
                    "## OOD detection by score (calibrated): AUROC / FPR@95%TPR",
                    "Every OOD score of the library, higher = more OOD; the gates read "
                    f"`{result['ood_score']}`. `-`: a score that needs members, of a one-member "
                    "model.",
                    ood_score_table(result),
                ]
                if all("ood_by_score" in e for e in result["models"].values())
                else []
            )
            + diversity_section(result)
            + (
                ["## `hydra-ens predict` verdicts (Hydra, calibrated)", verdict_table(result)]
                if "verdicts" in hydra
                else []
            )
            + (
                [
                    "## Paired bootstrap: Hydra minus each baseline (raw)",
                    bootstrap_table(result, "raw"),
                ]
                if all("raw" in b for b in result["bootstrap"].values())
                else []
            )
        )
        + "\n"
    )
