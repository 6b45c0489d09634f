"""The prepared GPU check: fine-tune, merge, verify and time Hydra against the single model.

``python -m benchmarks.gpu_check [--device cuda] [--steps 20] [--batch 64] [--out FILE]``

Uses ``hydra_ops`` alone (plus torch and transformers): nothing from ``tasks/`` or ``flows/``, no
Prefect, DVC or pydantic, so it runs on a bare GPU image. Steps:

1. A BERT base of ``--shape``: ``minilm`` (default; the packaged MiniLM-L6 through
   :func:`hydra_ops.models.factory.load_text_classifier` when importable, else random init of the
   same shape), ``bert-base`` (random init; the paper's text scale, more work per kernel), ``tiny``
   (a 3-layer toy for smoke tests; also ``--tiny``). For each ``--shared-layers`` value ``k``
   (default ``0``, the paper's merge; ``half`` = L/2, the served default's shared trunk), one
   Hydra variant: M members, each keeping a disjoint 1/M of the heads of every layer from ``k``
   on (layers below ``k`` keep all heads and stay equal across members).
2. Member 0 of each variant is fine-tuned for ``--steps`` steps on synthetic batches with
   :func:`hydra_ops.models.training.fine_tune` on ``--device`` at ``--train-precision`` (bf16), its
   embeddings and first ``k`` layers frozen when ``k > 0``; the other members get seeded noise
   outside that trunk (a stand-in for their own fine-tuning).
3. :func:`hydra_ops.hydra.merge.merge_members` (stack mode, ``shared_layers=k``); each merged model
   must equal its stacked members: max |p_hydra - p_members| of member probabilities within the
   precision's tolerance (fp32 1e-4, bf16/fp16 2e-2), else exit status 1 (also when an eager row
   fails).
4. The table: single model vs each Hydra variant at every ``--precisions`` (eager under
   :func:`hydra_ops.models.runtime.autocast`; compiled via :func:`hydra_ops.compile.compile_model`
   with ``precision=``), eager + inductor + cudagraphs (inductor with CUDA graphs: no launch cost) +
   TensorRT (when ``import torch_tensorrt`` works) on CUDA, timed round-robin, with Hydra /
   single at equal precision and backend next to that variant's FLOP ratio (the paper reports
   1.07 at bf16). Every latency is also given against the reference: the single model, fp32 eager.
5. With ``--auto-compile``: what the pipeline's compile stage does with ``backend: auto,
   precision: auto`` here (:func:`hydra_ops.compile.compile_model` on the last variant: every
   backend x precision candidate built, checked against the fp32 eager model, timed; the
   fastest that agrees kept), its choice, the one-line reason and every trial; exit status 1
   when no candidate compiled and agreed (the compile stage would fail the same way).

Writes a JSON report to ``--out`` (atomically). CPU smoke test: ``--device cpu --steps 2 --tiny``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch import Tensor, nn

from benchmarks import measure
from benchmarks.rows import build_row, default_backends, ratio, time_rows, write_report
from benchmarks.workloads import make_members
from hydra_ops.compile.precision import DEFAULT_TOLERANCES
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
from hydra_ops.hydra.merge import HydraEnsemble, merge_members
from hydra_ops.models.runtime import autocast, bf16_supported, resolve_device

NUM_LABELS = 4
PAPER_BF16_RATIO = 1.07
MINILM_SHAPE = {"hidden": 384, "layers": 6, "heads": 12, "ffn": 1536, "vocab": 30522}
BERT_BASE_SHAPE = {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 30522}
TINY_SHAPE = {"hidden": 48, "layers": 3, "heads": 6, "ffn": 64, "vocab": 100}
#: ``--shape`` choices: MiniLM-L6 (the default task), BERT-base (the paper's text scale), a toy.
SHAPES = {"minilm": MINILM_SHAPE, "bert-base": BERT_BASE_SHAPE, "tiny": TINY_SHAPE}


class SingleAsEnsemble(nn.Module):
    """A ``BertForSequenceClassification`` with Hydra's call convention:
    ``(input_ids [B, T], attention_mask [B, T] | None, token_type_ids | None) -> [B, 1, C]``,
    so ``compile_model`` takes it as it takes a :class:`HydraEnsemble`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_members = 1

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        out = self.model(
            input_ids=inputs, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return out.logits[:, None, :]


def build_base(shape_name: str) -> tuple[nn.Module, str, dict[str, int]]:
    """``(model, where it came from, shape)``: for ``minilm`` the packaged MiniLM-L6 when
    importable; otherwise (and for every other shape) a random-init BERT of that shape."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    shape = SHAPES[shape_name]
    if shape_name == "minilm":
        try:
            from hydra_ops.models.factory import load_text_classifier

            model, _ = load_text_classifier(NUM_LABELS)
            return model.eval(), "hydra_ops.models.factory.load_text_classifier (MiniLM-L6)", shape
        except (ImportError, ValueError, OSError) as error:
            print(f"[gpu_check] MiniLM-L6 not available ({error}); random init, same shape")
    config = BertConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["ffn"],
        num_labels=NUM_LABELS,
        max_position_embeddings=512,
    )
    return BertForSequenceClassification(config).eval(), "random init", shape


def variant_name(shared_layers: int) -> str:
    """``hydra`` for the paper's merge (every layer pruned), ``hydra_shared<k>`` otherwise."""
    return "hydra" if shared_layers == 0 else f"hydra_shared{shared_layers}"


def parse_shared_layers(text: str, num_layers: int) -> list[int]:
    """``"0,half,3"`` -> ``[0, L // 2, 3]`` (order kept, duplicates dropped), each in ``0..L-1``."""
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "half":
            k = num_layers // 2
        elif part.isdigit():
            k = int(part)
        else:
            raise ValueError(f"shared-layers must be ints or 'half', got {part!r}")
        if not 0 <= k < num_layers:
            raise ValueError(f"shared-layers must be in 0..{num_layers - 1}, got {k}")
        if k not in values:
            values.append(k)
    if not values:
        raise ValueError("shared-layers: give at least one value")
    return values


def synthetic_batches(
    n: int, batch: int, seq: int, vocab: int, seed: int
) -> list[dict[str, Tensor]]:
    """``n`` batches of random ids with a learnable label (``ids[:, 1] % C``)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, vocab, (batch, seq), generator=g)
        out.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": ids[:, 1] % NUM_LABELS,
            }
        )
    return out


def check_equivalence(
    hydra: HydraEnsemble,
    members: list[nn.Module],
    ids: Tensor,
    mask: Tensor,
    device: torch.device,
    precision: str,
) -> dict[str, Any]:
    """Max |softmax(hydra) - softmax(member)| over members and items, at ``precision``."""
    with torch.no_grad(), autocast(device, precision):
        merged = hydra(ids, mask).float()
        stacked = torch.stack(
            [m(input_ids=ids, attention_mask=mask).logits.float() for m in members], dim=1
        )
    diff = (merged.softmax(-1) - stacked.softmax(-1)).abs().max().item()
    tolerance = DEFAULT_TOLERANCES[precision]
    return {
        "precision": precision,
        "max_prob_diff": diff,
        "tolerance": tolerance,
        "ok": diff <= tolerance,
    }


def pick_implementation(
    members: list[nn.Module], ids: Tensor, mask: Tensor, device: torch.device, precision: str
) -> str:
    """The fastest grouped attention implementation here (1 warm-up + 3 timed calls each)."""
    best: tuple[float, str] | None = None
    for impl in sorted(ATTENTION_IMPLEMENTATIONS):
        hydra = merge_members(members, mode="stack", attention=impl).to(device).eval()
        with torch.no_grad(), autocast(device, precision):
            fn = lambda h=hydra: h(ids, mask)  # noqa: E731
            measure.warm_up(fn, device)
            t = measure.time_round_robin([fn], device, 0.0, 3, 3)[0].summary()
        if best is None or t["latency_ms_median"] < best[0]:
            best = (t["latency_ms_median"], impl)
        del hydra
    return best[1]


def row_backends(device: torch.device) -> list[str]:
    """``eager`` everywhere; on CUDA also ``cudagraphs`` (the launch-free row) and the usable
    ones of ``inductor`` and ``tensorrt`` (:func:`benchmarks.rows.default_backends`)."""
    if device.type != "cuda":
        return ["eager"]
    return ["eager", *default_backends(device, ("inductor", "tensorrt")), "cudagraphs"]


def build_rows(
    models: dict[str, nn.Module],
    precisions: list[str],
    backends: list[str],
    inputs: tuple[Tensor, Tensor],
    device: torch.device,
    work: Path,
    batch: int,
) -> list[dict[str, Any]]:
    """One row per (precision, backend, model) with its callable in ``fn`` (or an ``error``)."""
    from hydra_ops.compile import compile_model

    rows = []
    for precision in precisions:
        for backend in backends:
            for name, model in models.items():
                row = {"model": name, "precision": precision, "backend": backend, "error": None}

                def make(
                    m: nn.Module = model, n: str = name, p: str = precision, b: str = backend
                ) -> dict[str, Any]:
                    if b == "eager":

                        def fn() -> Tensor:
                            with autocast(device, p):
                                return m(*inputs)

                        return {"fn": fn}
                    if b == "cudagraphs":
                        graphed = cuda_graphed(m, p, device)
                        return {"fn": lambda: graphed(*inputs)}
                    t0 = time.perf_counter()
                    artifact = compile_model(
                        m, b, inputs, work / f"{n}_{b}_{p}", max_batch=batch, precision=p
                    )
                    return {"fn": lambda: artifact(*inputs), "compile_s": time.perf_counter() - t0}

                rows.append(build_row(row, make))
    return rows


def cuda_graphed(model: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """``model`` cast to ``precision`` and compiled by inductor with CUDA graphs
    (``mode="reduce-overhead"``): one graph replay per call, so no per-kernel launch cost. A
    benchmark row only (not a ``compile_model`` backend: its outputs live in graph-owned memory
    that the next call overwrites)."""
    if device.type != "cuda":
        raise ValueError("cudagraphs: CUDA only")
    from hydra_ops.compile.precision import cast_model

    return torch.compile(cast_model(model, precision), mode="reduce-overhead")


def ratios(rows: list[dict[str, Any]], flop_ratios: dict[str, float]) -> list[dict[str, Any]]:
    """Each Hydra variant / single per (precision, backend), and both against single fp32 eager.

    ``flop_ratios``: variant name -> its FLOP ratio to the single model."""
    key = {(r["model"], r["precision"], r["backend"]): r.get("latency_ms_median") for r in rows}
    ref = key.get(("single", "fp32", "eager"))
    out = []
    for r in rows:
        if r["model"] not in flop_ratios:
            continue
        flop_ratio = flop_ratios[r["model"]]
        hydra = r.get("latency_ms_median")
        single = key.get(("single", r["precision"], r["backend"]))
        over_single = ratio(hydra, single)
        out.append(
            {
                "model": r["model"],
                "precision": r["precision"],
                "backend": r["backend"],
                "single_ms": single,
                "hydra_ms": hydra,
                "hydra_over_single": over_single,
                "flop_ratio": flop_ratio,
                "over_flop_ratio": ratio(over_single, flop_ratio),
                "single_over_reference": ratio(single, ref),
                "hydra_over_reference": ratio(hydra, ref),
            }
        )
    return out


def print_table(table: list[dict[str, Any]]) -> None:
    def f(value: float | None, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    print(
        "| model | precision | backend | single ms | hydra ms | hydra / single | FLOP ratio "
        "| ÷ FLOP ratio | single ×ref | hydra ×ref |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(
            f"| {t['model']} | {t['precision']} | {t['backend']} | {f(t['single_ms'], 1)}"
            f" | {f(t['hydra_ms'], 1)} | {f(t['hydra_over_single'])} | {f(t['flop_ratio'])}"
            f" | {f(t['over_flop_ratio'])} | {f(t['single_over_reference'])}"
            f" | {f(t['hydra_over_reference'])} |"
        )
    print(
        f"(×ref: against the single model, fp32 eager; the paper reports hydra / single "
        f"{PAPER_BF16_RATIO} at bf16)"
    )


def auto_compile(
    model: nn.Module,
    inputs: tuple[Tensor, Tensor],
    heldout: list[tuple[Tensor, Tensor]],
    work: Path,
    batch: int,
    min_agreement: float,
) -> dict[str, Any]:
    """What the compile stage ships here with ``backend: auto, precision: auto``: its choice, the
    one-line reason, every trial and the wall time (or the error, as a row is)."""
    from hydra_ops.compile import compile_model

    t0 = time.perf_counter()
    try:
        artifact = compile_model(
            model,
            "auto",
            inputs,
            work / "auto",
            max_batch=batch,
            precision="auto",
            heldout_inputs=heldout,
            min_agreement=min_agreement,
        )
    except Exception as error:
        return {
            "error": f"{type(error).__name__}: {str(error)[:600]}",
            "seconds": time.perf_counter() - t0,
        }
    selection = artifact.metadata.get("auto_selection", {})
    return {
        "error": None,
        "seconds": time.perf_counter() - t0,
        "backend": artifact.backend,
        "precision": artifact.metadata.get("precision"),
        "device": artifact.metadata.get("device"),
        "precision_reason": artifact.metadata.get("precision_reason"),
        "skipped_precisions": selection.get("skipped_precisions"),
        "trials": selection.get("trials"),
        "failed_backends": artifact.metadata.get("failed_backends"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--steps", type=int, default=20, help="fine-tuning steps of member 0")
    parser.add_argument("--train-precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64, help="batch of the timed calls")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--precisions", default="bf16,fp32", help="comma list: fp32, bf16, fp16")
    parser.add_argument(
        "--backends",
        default=None,
        help="comma list of eager, cudagraphs (CUDA: inductor with CUDA graphs, a benchmark row) "
        "and hydra_ops.compile backends (default: eager; on CUDA also inductor, cudagraphs, and "
        "tensorrt when it imports)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed calls per row")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="minilm", help="the BERT shape to build"
    )
    parser.add_argument(
        "--tiny", action="store_const", dest="shape", const="tiny", help="same as --shape tiny"
    )
    parser.add_argument(
        "--shared-layers",
        default="0",
        help="comma list of Hydra variants to time, each a shared trunk depth: ints or 'half' "
        "(L/2, the served default); 0 is the paper's merge (default: 0)",
    )
    parser.add_argument(
        "--implementation",
        choices=("pick", *sorted(ATTENTION_IMPLEMENTATIONS)),
        default="pick",
        help="grouped attention of every Hydra variant; 'pick' (default) times each in eager at "
        "the first precision and keeps the fastest (launch-bound on a large GPU, so noisy there: "
        "name one, e.g. padded_bmm, the merge's default, to compare leases)",
    )
    parser.add_argument(
        "--auto-compile",
        action="store_true",
        help="also run compile_model(backend='auto', precision='auto') on the last variant",
    )
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=1.0,
        help="--auto-compile's minimum argmax agreement with fp32 eager (the params' default 1.0)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    args = parser.parse_args(argv)
    try:  # every bad value is one line (argparse's usage + error, exit status 2), before any work
        args.precision_list = [p.strip() for p in args.precisions.split(",") if p.strip()]
        for p in args.precision_list:
            if p not in DEFAULT_TOLERANCES:
                raise ValueError(f"precisions must be among {list(DEFAULT_TOLERANCES)}, got {p!r}")
        if args.steps < 1:
            raise ValueError(f"steps must be >= 1, got {args.steps}")
        if not 0.0 <= args.min_agreement <= 1.0:
            raise ValueError(f"min-agreement must be in [0, 1], got {args.min_agreement}")
        args.shared = parse_shared_layers(args.shared_layers, SHAPES[args.shape]["layers"])
    except ValueError as error:
        parser.error(str(error))
    return args


def build_variant(
    base: nn.Module,
    shape: dict[str, int],
    args: argparse.Namespace,
    shared_layers: int,
    device: torch.device,
) -> tuple[list[nn.Module], dict[str, Any]]:
    """The members of one Hydra variant (on ``device``, eval mode) and member 0's fine-tune
    report: member 0 fine-tuned, the others perturbed, all equal below ``shared_layers``."""
    from hydra_ops.models.training import fine_tune

    members = make_members(
        base, shape["layers"], shape["heads"], args.members, shared_layers, noise_from=1
    )
    batches = synthetic_batches(args.steps, args.train_batch, args.seq, shape["vocab"], seed=0)
    report = fine_tune(
        members[0],
        lambda epoch: batches,
        epochs=1,
        lr=5e-5,
        device=device,
        precision=args.train_precision,
        progress=False,
        frozen_layers=shared_layers or None,
        log_fn=lambda line: print(f"[gpu_check] {variant_name(shared_layers)} fine-tune: {line}"),
    )
    members = [m.to(device).eval() for m in members]
    return members, {**report.to_dict(), "precision": args.train_precision}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    precisions, shared = args.precision_list, args.shared
    if "fp16" in precisions and device.type != "cuda":
        sys.exit(f"gpu_check: precisions: fp16 runs only on CUDA (device {device})")
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = (
        [b.strip() for b in args.backends.split(",") if b.strip()]
        if args.backends
        else row_backends(device)
    )
    rounds = args.rounds or (20 if device.type == "cuda" else 2)
    print(f"[gpu_check] device {device}; bf16: {bf16_supported(device)[1]}; backends {backends}")

    base, source, shape = build_base(args.shape)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, shape["vocab"], (args.batch, args.seq), generator=g).to(device)
    mask = torch.ones_like(ids)
    n_check = min(8, args.batch)
    single = SingleAsEnsemble(copy.deepcopy(base).to(device).eval()).eval()
    with torch.no_grad():
        single_flops = measure.count_flops(lambda: single(ids[:1], mask[:1]))

    impl: str | None = None if args.implementation == "pick" else args.implementation
    hydras: dict[str, nn.Module] = {}
    variants: list[dict[str, Any]] = []
    for k in shared:
        members, fine_tuned = build_variant(base, shape, args, k, device)
        impl = impl or pick_implementation(members, ids, mask, device, precisions[0])
        name = variant_name(k)
        hydra = merge_members(members, mode="stack", attention=impl, shared_layers=k)
        hydra = hydra.to(device).eval()
        equivalence = [
            {
                "model": name,
                **check_equivalence(hydra, members, ids[:n_check], mask[:n_check], device, p),
            }
            for p in sorted(set(precisions) | {"fp32"})
        ]
        for check in equivalence:
            print(f"[gpu_check] {name}: merged == stacked members at {check['precision']}: {check}")
        with torch.no_grad():
            hydra_flops = measure.count_flops(lambda h=hydra: h(ids[:1], mask[:1]))
        del members
        hydras[name] = hydra
        flops = {"single": single_flops, "hydra": hydra_flops, "ratio": hydra_flops / single_flops}
        variants.append(
            {
                "model": name,
                "shared_layers": k,
                "fine_tune": fine_tuned,
                "equivalence": equivalence,
                "flops": flops,
            }
        )
    del base
    heldout_ids = torch.randint(1, shape["vocab"], (args.batch, args.seq), generator=g).to(device)
    with tempfile.TemporaryDirectory(prefix="hydra-gpu-check-") as work:
        rows = build_rows(
            {"single": single, **hydras},
            precisions,
            backends,
            (ids, mask),
            device,
            Path(work),
            args.batch,
        )
        time_rows(rows, device, rounds, rounds, warmup_calls=3)
        auto = None
        if args.auto_compile:
            last = variants[-1]["model"]
            print(f"[gpu_check] compile_model(auto, precision=auto) on {last} ...")
            auto = auto_compile(
                hydras[last],
                (ids, mask),
                [(heldout_ids, torch.ones_like(heldout_ids))],
                Path(work),
                args.batch,
                args.min_agreement,
            )
            auto["model"] = last
            print(f"[gpu_check] auto compile: {json.dumps(auto, default=str)}")
    table = ratios(rows, {v["model"]: v["flops"]["ratio"] for v in variants})
    print(f"[gpu_check] batch {args.batch}, seq {args.seq}, M = {args.members}, hydra[{impl}]")
    print_table(table)
    for row in rows:
        if row["error"]:
            print(f"[gpu_check] {row['model']} {row['backend']} {row['precision']}: {row['error']}")

    result = {
        "format": "hydra-ens-gpu-check/2",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "base": source,
        "shape_name": args.shape,
        "shape": shape,
        "members": args.members,
        "batch": args.batch,
        "seq": args.seq,
        "default_implementation": impl,
        # the first variant's, as format 1 had them; every variant's are under "variants"
        "fine_tune": variants[0]["fine_tune"],
        "equivalence": [c for v in variants for c in v["equivalence"]],
        "flops": variants[0]["flops"],
        "variants": variants,
        "rows": rows,
        "table": table,
        "auto_compile": auto,
        "paper_bf16_hydra_over_single": PAPER_BF16_RATIO,
    }
    write_report(args.out, json.dumps(result, indent=2, default=str))
    print(f"[gpu_check] wrote {args.out}")
    # compiled backends are optional (their failures are rows with an error); eager must work,
    # and so must --auto-compile: no agreeing candidate is what the compile stage would fail on
    eager_failed = [r for r in rows if r["backend"] == "eager" and r["error"]]
    auto_failed = auto is not None and auto["error"] is not None
    ok = all(c["ok"] for c in result["equivalence"]) and not eager_failed and not auto_failed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
