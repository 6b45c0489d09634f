"""The sections of ``study.md``, each a list of lines: :func:`header`, then sections 1-7
(metrics per model, OOD per score, paired differences, Pareto, gates, recommendation,
confirmation on held-out seeds), each
rendering what the summary (``study.json``) holds; docs/study_report.md explains the tables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.cells import (
    arrow,
    clip,
    diff_cell,
    md_table,
    metric_range,
    ordered_metrics,
    stat_cell,
)
from flows.study.report.collect import Collected
from flows.study.report.paired import BEATS_SINGLE, HEADLINE, TWIN_METRICS, claim_sentence
from flows.study.report.recommend import ratio_text
from flows.study.report.results import OOD_SPLITS, SPLITS
from hydra_ops.uq.ood_criteria import OOD_CRITERIA
from tasks.params import GateCheck


def _flatten_overrides(d: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, Mapping) and v:
            out += _flatten_overrides(v, f"{prefix}{k}.")
        else:
            out.append(f"`{prefix}{k}={json.dumps(v, sort_keys=True)}`")
    return out


def _wall(seconds: float) -> str:
    s = round(seconds)
    return f"{seconds:.0f} s ({s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s)"


def header(
    col: Collected,
    title: str,
    command: str | None,
    wall_seconds: float | None,
    variants: Mapping[str, Mapping[str, Any]] | None,
    confirm_seeds: Sequence[int] = (),
) -> list[str]:
    lines = [f"# {title}", ""]
    if command is not None:
        lines.append(f"- Command: `{command}`")
    if wall_seconds is not None:
        lines.append(f"- Wall time: {_wall(wall_seconds)}")
    lines.append(
        f"- Seeds: {', '.join(str(s) for s in col.seeds)} (n = {len(col.seeds)}); "
        f"points: {len(col.points)}"
    )
    if confirm_seeds and set(col.seeds) <= set(confirm_seeds):
        lines.append(
            "- Registered variants: fixed before any point ran; every seed is a confirmation "
            "seed (no choosing step; each variant's claims in section 7)"
        )
    elif confirm_seeds:
        lines.append(
            f"- Confirmation seeds (held out, never used for choosing; section 7): "
            f"{', '.join(str(s) for s in confirm_seeds)}"
        )
    lines.append(f"- Data split: {split_sentence(col)}")
    lines += ["", "Variants:", ""]
    rows = []
    for v in sorted(set(col.variants) | set(variants or {})):
        seeds = [str(p.seed) for p in col.points if p.variant == v]
        if variants is None or v not in variants:
            over = "(not given)"
        else:
            over = ", ".join(_flatten_overrides(variants[v])) or "(none: the defaults)"
        rows.append([f"`{v}`", over, ", ".join(seeds) or "no results"])
    lines.append(md_table(["variant", "overrides", "seeds with results"], rows))
    lines += [
        "",
        "Every number is calibrated (temperature scaling fitted on validation) and given as the "
        "mean across seeds with its 95% Student-t interval `[low, high]` "
        "(mean +- t(0.975, n-1) s / sqrt(n)), clipped to the metric's range; with one seed: "
        "`n=1, no interval`. A zero-width interval (the same value at every seed) is no "
        "evidence of a difference.",
    ]
    if col.mark:
        lines += ["", SPLIT_FOOTNOTE.format(seeds=col.split["data_seeds"][0])]
    return lines


#: The footnote of the mark beside every interval when the split is pinned.
SPLIT_FOOTNOTE = (
    "¹ Conditional on one data split (`data.seed` = {seeds} at every seed): the interval covers "
    "training noise only; split-to-split and test-sample variation are outside it."
)


def split_sentence(col: Collected) -> str:
    """Whether the seeds drew their own data split."""
    if col.mark:
        return (
            f"one split for every seed (`data.seed` pinned to {col.split['data_seeds'][0]}); "
            "every interval is conditional on it (marked ¹)."
        )
    if len(col.seeds) < 2:
        return "one seed."
    return (
        "drawn per seed (`data.seed` follows the seed): the intervals across seeds cover split "
        "and training noise together."
    )


def section_metrics(col: Collected) -> list[str]:
    lines = ["## 1. Metrics per model", ""]
    shared = ", ".join(f"`{b}`" for b in col.shared) or "none"
    lines.append(
        f"`hydra[<variant>]` is the Hydra of each variant. Baselines pooled once per seed "
        f"(the same model in every variant's run at a seed; latency averaged over those runs): "
        f"{shared}. `naive_pruned` and `control` depend on the variant and are listed per variant."
    )
    for b, seeds in sorted(col.unshared.items()):
        lines.append(
            f"\nNote: `{b}` differs between variants at seed(s) "
            f"{', '.join(str(s) for s in seeds)} (a variant overrides something it depends on), "
            "so it is listed per variant."
        )
    labels = col.labels()
    all_keys = {k for label in labels for m in col.series[label].values() for k in m}
    for split in SPLITS:
        metrics = ordered_metrics(all_keys, split)
        if not metrics:
            continue
        lines += ["", f"### {split}", ""]
        rows = []
        for label in labels:
            cells = [stat_cell(col.stats(label, f"{split}.{m}"), m, col.mark) for m in metrics]
            n = max(
                (st["n"] for m in metrics if (st := col.stats(label, f"{split}.{m}"))), default=0
            )
            rows.append([f"`{label}`", str(n), *cells])
        lines.append(md_table(["model", "n", *[m + arrow(m) for m in metrics]], rows))
    lines += [
        "",
        "### model",
        "",
        "Cost within each point (`metrics/cost.json`): every model timed in the run's one "
        "process, interleaved rounds, same batch, backend and precision, as a ratio to that "
        "point's single model; the across-seed mean [95%], then each seed's within-point "
        "bootstrap interval over rounds. FLOPs per timing batch (torch FlopCounterMode), "
        "parameters, and the absolute latency (ms per batch, which varies between runs).",
        "",
    ]
    rows = []
    for label in labels:
        ratio = col.stats(label, "model.cost_ratio")
        within = []
        for s in sorted(col.series[label]):
            m = col.series[label][s]
            if "model.cost_ratio_low" in m:
                lo, hi = m["model.cost_ratio_low"], m["model.cost_ratio_high"]
                within.append(f"s{s}: [{lo:.2f}, {hi:.2f}]")
        lat = col.stats(label, "model.latency_ms")
        par = col.stats(label, "model.parameters")
        n = max(st["n"] if st else 0 for st in (ratio, lat, par))
        rows.append(
            [
                f"`{label}`",
                str(n),
                stat_cell(ratio, "cost_ratio", col.mark),
                "; ".join(within) or "-",
                stat_cell(col.stats(label, "model.flops"), "flops"),
                stat_cell(par, "parameters"),
                stat_cell(lat, "latency_ms"),
            ]
        )
    header = [
        "model",
        "n",
        "cost ratio to single (lower better)",
        "within-point 95%",
        "FLOPs",
        "parameters",
        "latency_ms",
    ]
    lines.append(md_table(header, rows))
    return lines


def section_ood(col: Collected, ood: Mapping[str, Any]) -> list[str]:
    lines = ["## 2. OOD detection per score", ""]
    if not ood["available"]:
        lines.append(
            "The per-score OOD table is unavailable: these evaluate.json files have no "
            "`ood_by_score` (written by an older pipeline). Section 1's near_ood/far_ood columns "
            "use the run's `evaluate.ood_score`."
        )
        return lines
    lines.append(
        "AUROC and FPR@95%TPR of each OOD score (OOD = positive class). `n/a (single model)`: the "
        "score needs members (mutual information, disagreement). `unavailable`: that model's "
        "evaluate.json has no `ood_by_score`."
    )
    scores_found = {
        score
        for e in ood["models"].values()
        if isinstance(e, Mapping)
        for by_score in e.values()
        for score in by_score
    }
    scores = [s for s in OOD_CRITERIA if s in scores_found]  # registry order, then the rest
    scores += sorted(scores_found - set(scores))
    for split in OOD_SPLITS:
        for metric in ("auroc", "fpr_at_95_tpr"):
            lines += ["", f"### {split} {metric}{arrow(metric)}", ""]
            rows = []
            for label, e in ood["models"].items():
                if not isinstance(e, Mapping):
                    rows.append([f"`{label}`", *["unavailable"] * len(scores)])
                    continue
                cells = []
                for score in scores:
                    by_score = e.get(split, {})
                    if score not in by_score:
                        cells.append("-")
                    elif by_score[score] is None:
                        cells.append("n/a (single model)")
                    else:
                        cells.append(stat_cell(by_score[score].get(metric), metric, col.mark))
                rows.append([f"`{label}`", *cells])
            lines.append(md_table(["model", *scores], rows))
    return lines


def section_paired(col: Collected, paired: Mapping[str, Any]) -> list[str]:
    lines = [
        "## 3. Paired differences: Hydra minus baselines",
        "",
        "Per seed, Hydra minus the baseline evaluated in the same run, and beside it that run's "
        "paired bootstrap interval over the test examples (evaluate.json "
        "`bootstrap.<baseline>.calibrated`, `b: [low, high]`) with its reading: `> 0` / `< 0` "
        "when it excludes 0, `n.s.` when it contains 0 (none for FPR@95: evaluate.json has no "
        "interval); one run's reading, uncorrected for the many comparisons: not a claim. The "
        "words better and worse are kept for comparisons that survive Holm's correction "
        "(sections 6 and 7). The last row is the mean across seeds with its 95% interval. The "
        "bootstrap measures the test-sample noise of one run; the across-seed interval "
        "measures seed noise (training, and the split when it is drawn per seed). "
        "`naive_pruned` is the Hydra's twin (the base with the same kept heads, no fine-tune) "
        "and `control` its control (unpruned copies given the same member fine-tune).",
    ]
    if not paired:
        lines += ["", "No Hydra/baseline pair to compare."]
    for v, by_base in paired.items():
        for b, per_metric in by_base.items():
            keys = [k for k in HEADLINE if k in per_metric]
            lines += ["", f"### `hydra[{v}]` - `{b}`", ""]
            rows = []
            for s in col.seeds:
                cells = []
                for k in keys:
                    val = next(
                        (r["value"] for r in per_metric[k]["per_seed"] if r["seed"] == s), None
                    )
                    boot = next((r for r in per_metric[k]["bootstrap"] if r["seed"] == s), None)
                    cell = "-" if val is None else f"{val:+.4f}"
                    if val is not None and boot is not None:
                        rng = metric_range(k, difference=True)
                        lo, hi = clip(boot["low"], rng), clip(boot["high"], rng)
                        cell += f" (b: [{lo:+.4f}, {hi:+.4f}] {boot['direction']})"
                    cells.append(cell)
                rows.append([f"seed {s}", *cells])
            rows.append(["**mean [95%]**", *[diff_cell(per_metric[k], k, col.mark) for k in keys]])
            header = ["seed", *[k + arrow(k.split(".", 1)[1]) for k in keys]]
            lines.append(md_table(header, rows))
    return lines


def section_pareto(pareto: Mapping[str, Any]) -> list[str]:
    lines = [
        "## 4. Cost vs uncertainty quality (Pareto)",
        "",
        "x: each model's cost as a ratio to the single model of the same point (within-point "
        "timing, log scale), mean across seeds; y: the metric's mean; error bars the 95% "
        "intervals across seeds. One colour and marker per model kind; the numbers are listed "
        "beside each plot and below. Ringed points joined by the dashed line are the Pareto "
        "front: no other model is both at least as cheap and at least as good.",
    ]
    for key, p in pareto.items():
        numbers = ", ".join(f"{q['number']} `{q['label']}`" for q in p["points"])
        lines += [
            "",
            f"![cost vs {key}]({p['figure']})",
            "",
            f"Points: {numbers}.",
            "",
            f"Pareto front (cost vs {key}): " + (", ".join(f"`{f}`" for f in p["front"]) or "none"),
        ]
        if p["missing"]:
            lines.append(
                "Not plotted (no cost ratio or metric): "
                + ", ".join(f"`{m}`" for m in p["missing"])
            )
    return lines


def section_gates(
    point_gates: Sequence[Mapping[str, Any]],
    base: Mapping[str, Any],
    gates: Sequence[GateCheck] | None = None,
) -> list[str]:
    lines = ["## 5. Gates", ""]
    if gates is None:
        lines += ["### Hydra, per point (reports/gate.json)", ""]
    else:
        lines += [
            "Judged with the gates given to the report (`hydra-ens study --gates-from`), not the "
            "points' own: " + ", ".join(f"`{g.name}`" for g in gates) + ".",
            "",
            "### Hydra, per point",
            "",
        ]
    rows = [
        [f"`{g['variant']}`", str(g["seed"]), g["verdict"].upper(), ", ".join(g["failed"]) or "-"]
        for g in point_gates
    ]
    lines.append(md_table(["variant", "seed", "verdict", "failed checks"], rows))
    lines += [
        "",
        "### Baselines as candidates",
        "",
        "The same checks (each point's `params.gates`, or the gates given to the report) with the "
        "baseline in Hydra's place: would "
        "the gates have let that model ship? `n/a`: `prod` comparisons (a study point has no "
        "prod model), a baseline compared with itself, and model-level checks (compile, latency "
        "and parameter thresholds of the Hydra artifact; always n/a, not listed). A "
        "`use_bootstrap_bound` check compares the point difference (the bootstrap "
        "in evaluate.json is Hydra minus each baseline).",
        "",
    ]
    rows = []
    for label, b in base.items():
        for r in b["rows"]:
            where = f" (run of `{r['in_run_of']}`)" if r["in_run_of"] else ""
            rows.append(
                [
                    f"`{label}`",
                    f"{r['seed']}{where}",
                    "PASSED" if r["passed"] else "FAILED",
                    ", ".join(r["failed"]) or "-",
                    ", ".join(r["not_applicable"]) or "-",
                ]
            )
    header = ["candidate", "seed", "verdict", "failed checks", "n/a (besides model-level)"]
    lines.append(md_table(header, rows))
    lines.append("")
    for label, b in base.items():
        n_rows = len({r["seed"] for r in b["rows"]})
        caught = "; ".join(
            f"{name} (seed {', '.join(str(s) for s in seeds)})"
            for name, seeds in b["caught_by"].items()
        )
        lines.append(
            f"- `{label}` passes on {len(b['seeds_passed'])} of {n_rows} seeds"
            + (f"; caught by: {caught}" if caught else "; no check catches it")
        )
    return lines


def section_recommendation(
    rec: Mapping[str, Any], beats: Mapping[str, Any], twin: Mapping[str, Any]
) -> list[str]:
    lines = ["## 6. Recommendation", "", rec["sentence"], ""]
    lines.append(
        "A variant is named only when it passes the gates on every seed and its Hydra beats its "
        "naive pruned twin across seeds on at least one of "
        + ", ".join(TWIN_METRICS)
        + f" (the 95% interval of the mean Hydra - twin difference excludes 0 on the good side, "
        f"after Holm's correction over the {twin['m']} (variant, metric) comparisons). Among "
        "those, the lowest Hydra cost ratio to single wins; ratios closer than their intervals' "
        "half-width are ties, broken by FLOPs, then parameters."
    )
    lines.append("")
    rows = [
        [
            f"`{r['variant']}`",
            "yes" if r["passes_every_seed"] else "no",
            "-" if r["beats_twin"] is None else ("yes" if r["beats_twin"] else "no"),
            "; ".join(f"seed {s}: {', '.join(f)}" for s, f in r["failing"].items()) or "-",
            ratio_text(r["cost"]),
            ratio_text(r["twin_cost"]),
        ]
        for r in rec["variants"]
    ]
    header = [
        "variant",
        "passes every seed",
        "beats its twin",
        "failing",
        "Hydra cost",
        "twin (naive_pruned) cost",
    ]
    lines.append(md_table(header, rows))
    lines += ["", "### Does each Hydra beat its naive pruned twin?", ""]
    lines += [f"- {t['sentence']}" for t in twin["variants"].values()]
    lines += ["", "### Does any variant beat the single model?", ""]
    fam = beats["_family"]
    lines.append(
        "A variant beats the single model on a metric when the 95% interval of the mean "
        "(Hydra - single) difference across seeds excludes 0 in the good direction and the "
        f"claim survives Holm's step-down over the {fam['m']} (variant, metric) comparisons of "
        "this list (family-wise error 5%)."
    )
    lines.append("")
    lines += [f"- {beats[k]['sentence']}" for k in BEATS_SINGLE]
    return lines


def section_registered(rec: Mapping[str, Any]) -> list[str]:
    return ["## 6. Recommendation", "", rec["sentence"]]


def section_confirmation(confirm: Mapping[str, Any] | None) -> list[str]:
    lines = ["## 7. Confirmation on held-out seeds", ""]
    if confirm is None:
        lines.append("The study names no `confirm_seeds`: nothing was held out.")
        return lines
    seeds = ", ".join(str(s) for s in confirm["seeds"])
    lines.append(
        (
            f"Seeds {seeds} confirm variants registered before any point ran. Here is what they "
            "say about every variant"
            if confirm.get("registered")
            else f"Seeds {seeds} were run like the others but never used for choosing: the "
            "choice above was made on the choosing seeds alone. Here is what they say about "
            + (
                f"the chosen variant `{confirm['variant']}` (first) and every other variant run "
                "on them"
                if confirm["variant"]
                else "every variant run on them (none was chosen)"
            )
        )
        + f" ({confirm['split']}); each variant's twin claim is tested on its own (Holm over "
        + "its own metrics)."
    )
    if not confirm["points"]:
        lines += ["", "No confirmation point has a result yet."]
        return lines
    lines += ["", "### Gates on the confirmation seeds", ""]
    rows = [
        [f"`{g['variant']}`", str(g["seed"]), g["verdict"].upper(), ", ".join(g["failed"]) or "-"]
        for g in confirm["gates"]
    ]
    lines.append(md_table(["variant", "seed", "verdict", "failed checks"], rows))
    for v, by_base in confirm["paired"].items():
        lines += ["", f"### `hydra[{v}]` on the confirmation seeds (mean [95%] across them)", ""]
        keys = [k for k in HEADLINE if any(k in m for m in by_base.values())]
        rows = [
            [f"`{b}`", *[diff_cell(m[k], k, confirm["mark"]) if k in m else "-" for k in keys]]
            for b, m in by_base.items()
        ]
        header = ["Hydra minus", *[k + arrow(k.split(".", 1)[1]) for k in keys]]
        lines.append(md_table(header, rows))
        costs = confirm.get("costs", {}).get(v)
        if costs:
            lines += ["", "Cost on the confirmation seeds (mean [95%] across them):", ""]
            lines.append(
                md_table(["model", "cost"], [[f"`{m}`", ratio_text(c)] for m, c in costs.items()])
            )
        elif (cost := confirm["cost"].get(v)) is not None:
            lines += ["", f"Hydra cost on the confirmation seeds: {ratio_text(cost)}."]
        claims = confirm.get("claims", {}).get(v)
        if claims:
            lines += [
                "",
                "Each comparison in words: `better` / `worse` only where Holm's step-down over "
                "its family (5% family-wise) rejects no difference, `no detectable difference` "
                f"otherwise. Families: Hydra against the baselines on {', '.join(BEATS_SINGLE)} "
                f"({claims['baselines']['m']} comparisons); Hydra against its twin on "
                f"{', '.join(TWIN_METRICS)} ({claims['twin']['m']}).",
                "",
            ]
            for fam in (claims["baselines"], claims["twin"]):
                lines += [
                    f"- {claim_sentence(v, name, t, fam['m'], confirm['mark'])}"
                    for name, t in fam["tests"].items()
                ]
    lines.append("")
    lines += [f"- {t['sentence']}" for t in confirm["twin"]["variants"].values()]
    return lines
