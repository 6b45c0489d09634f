"""The benchmark: Hydra vs single model vs Deep Ensemble, side by side, in one process.

``python -m benchmarks.run [--models minilm,vit_s,vit_b] [--smoke] [--out benchmarks/results]``
writes ``results.json`` and ``results.md`` (the table of docs/benchmarks.md). Every figure is also
given as a ratio to the single unpruned base model of the same case. See ``--help``.

``--precisions fp32,bf16`` (fp16: CUDA only) adds the precision axis: every row is built once per
precision (eager rows run under :func:`hydra_ops.models.runtime.autocast` on fp32 weights, as
served; compiled rows are ``compile_model(..., precision=p)``), all rows of a case are timed
round-robin together, and every ratio is taken against the *reference row*: the single model, fp32
eager (``base`` at ``fp32``, what a user runs today). ``same_precision_ratio`` is the latency
against ``base`` at the row's own precision, ``same_precision_over_flops`` that ratio over the FLOP
ratio.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import typer
from torch import Tensor

from benchmarks import measure
from benchmarks.rows import (
    build_row,
    default_backends,
    error_text,
    ratio,
    time_rows,
    write_report,
)
from benchmarks.workloads import (
    FULL_MODELS,
    MODELS,
    SMOKE_MODELS,
    ModelSpec,
    is_text,
    make_inputs,
    make_members,
    perturb,
    sequential_ensemble_fn,
    single_fn,
    vmap_ensemble_fn,
)
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS, MemberGemmMLP
from hydra_ops.hydra.merge import HydraEnsemble, merge_members

COLUMNS = (
    "case",
    "model",
    "batch",
    "seq",
    "row",
    "kind",
    "implementation",
    "backend",
    "precision",
    "shared_layers",
    "latency_ms_median",
    "latency_ms_p25",
    "latency_ms_p75",
    "latency_ms_min",
    "repeats",
    "throughput_per_s",
    "peak_mem_mb",
    "params",
    "flops",
    "warmup_s",
    "latency_ratio",
    "throughput_ratio",
    "memory_ratio",
    "params_ratio",
    "flops_ratio",
    "same_precision_ratio",
    "same_precision_over_flops",
    "error",
)
OUT_OPTION = typer.Option(Path("benchmarks/results"), help="output directory")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
PRECISIONS = ("fp32", "bf16", "fp16")
REFERENCE = {"row": "base", "precision": "fp32", "label": "single model, fp32 eager"}


def expected_rows(spec: ModelSpec, backends: list[str]) -> list[str]:
    """Row names of every case of ``spec`` (the JSON holds exactly these, in this order)."""
    rows = ["base", "pruned_single", "deep_ensemble_seq", "deep_ensemble_vmap"]
    rows += [f"hydra[{name}]" for name in sorted(ATTENTION_IMPLEMENTATIONS)]
    rows += ["hydra[member_gemm+gemm_mlp]", "hydra_average"]
    rows += [f"hydra+{b}" for b in backends]
    rows += [f"hydra_shared{k}" for k in shared_values(spec.num_layers) if k]
    return rows


def shared_values(num_layers: int) -> list[int]:
    """``shared_layers`` in {0, L/3, L/2} (deduplicated, each < L)."""
    return sorted({0, num_layers // 3, num_layers // 2} - {num_layers})


class ModelBench:
    """All models of one architecture, built once and reused across its cases."""

    def __init__(self, spec: ModelSpec, m: int, device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.m, self.device, self.dtype = spec, m, device, dtype
        base = spec.build().to(device=device, dtype=dtype).eval()
        self.base = base
        self.members = make_members(base, spec.num_layers, spec.num_heads, m)
        self.pruned = self.members[0]
        self.deep = [perturb(copy.deepcopy(base), 500 + i) for i in range(m)]
        self.hydras: dict[str, HydraEnsemble] = {
            impl: merge_members(self.members, mode="stack", attention=impl)
            for impl in sorted(ATTENTION_IMPLEMENTATIONS)
        }
        gemm_mlp = merge_members(self.members, mode="stack", attention="member_gemm")
        for block in gemm_mlp.blocks:
            block.mlp = MemberGemmMLP.from_grouped(block.mlp)
        self.hydra_gemm_mlp = gemm_mlp
        self.default_impl: str | None = None
        self.compiled: dict[str, Any] = {}
        self.compile_errors: dict[str, str] = {}
        self.shared: dict[int, HydraEnsemble] = {}
        self.average: HydraEnsemble | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="hydra-bench-")

    def pick_default(self, inputs: tuple[Tensor, ...]) -> str:
        """Fastest grouped implementation on this device (pilot: 1 warm-up + 2 timed calls)."""
        if self.default_impl is None:
            best: tuple[float, str] | None = None
            with torch.no_grad():
                for impl, hydra in self.hydras.items():
                    measure.warm_up(lambda h=hydra: h(*inputs), self.device)
                    t = measure.time_round_robin(
                        [lambda h=hydra: h(*inputs)], self.device, 0.0, 2, 2
                    )[0].summary()["latency_ms_median"]
                    if best is None or t < best[0]:
                        best = (t, impl)
            self.default_impl = best[1]
            default = self.hydras[self.default_impl]
            self.average = merge_members(self.members, mode="average", attention=self.default_impl)
            for k in shared_values(self.spec.num_layers):
                if k:
                    members = make_members(
                        self.base,
                        self.spec.num_layers,
                        self.spec.num_heads,
                        self.m,
                        shared_layers=k,
                    )
                    self.shared[k] = merge_members(
                        members, mode="stack", attention=self.default_impl, shared_layers=k
                    )
            del default
        return self.default_impl

    def compiled_fn(
        self,
        backend: str,
        inputs: tuple[Tensor, ...],
        max_batch: int,
        precision: str | None = None,
    ) -> Any:
        """The default Hydra compiled with ``backend`` (cached per backend and precision).

        ``precision`` None: the model as it is (legacy ``--dtype`` runs); else passed to
        ``compile_model(..., precision=...)``. Failures are recorded in ``compile_errors``."""
        from hydra_ops.compile import compile_model

        key = backend if precision is None else f"{backend}@{precision}"
        if key not in self.compiled and key not in self.compile_errors:
            out = Path(self._tmp.name) / key.replace("@", "_")
            extra = {} if precision is None else {"precision": precision}
            t0 = time.perf_counter()
            try:
                self.compiled[key] = compile_model(
                    self.hydras[self.default_impl],
                    backend,
                    inputs,
                    out,
                    max_batch=max_batch,
                    **extra,
                )
                self.compiled[key].metadata["bench_compile_s"] = time.perf_counter() - t0
            except Exception as error:
                self.compile_errors[key] = error_text(error)
        return self.compiled.get(key)


def case_rows(
    bench: ModelBench,
    batch: int,
    seq: int | None,
    backends: list[str],
    max_batch: int,
    precision: str | None = None,
    only_base: bool = False,
) -> list[dict[str, Any]]:
    """Build every row of one case (callable + static facts), in ``expected_rows`` order.

    ``precision`` None: the legacy ``--dtype`` run (weights at ``bench.dtype``, no autocast; the
    rows' ``precision`` is that dtype's). Else eager rows run under ``autocast(device, precision)``
    and compiled rows are compiled at ``precision``. ``only_base``: just the ``base`` row (the
    fp32 reference when fp32 is not among the measured precisions)."""
    from hydra_ops.models.runtime import autocast

    spec, dev = bench.spec, bench.device
    inputs = make_inputs(spec, batch, seq, dev, bench.dtype)
    one = make_inputs(spec, 1, seq, dev, bench.dtype)
    default = bench.pick_default(inputs)
    rows: list[dict[str, Any]] = []
    label = precision or DTYPE_PRECISION[_dtype_name(bench.dtype)]

    def under_precision(f: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if precision is None or precision == "fp32":
            return f

        def run(*x: Tensor) -> Tensor:
            with autocast(dev, precision):
                return f(*x)

        return run

    def add(
        name: str,
        kind: str,
        make: Callable[[], Callable[..., Tensor]],
        params: int,
        flop_model: Callable[..., Tensor] | None = None,
        **facts: Any,
    ) -> None:
        if only_base and name != "base":
            return
        row = {"row": name, "kind": kind, "params": params, "precision": label, **facts}

        def callables() -> dict[str, Callable[[], Tensor]]:
            fn = make()
            if kind != "hydra_compiled":
                fn = under_precision(fn)
            flop_fn = under_precision(flop_model) if flop_model else fn
            return {"fn": lambda f=fn: f(*inputs), "flops_fn": lambda f=flop_fn: f(*one)}

        rows.append(build_row(row, callables))

    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    fam = spec.family
    add("base", "single", lambda: single_fn(bench.base, fam), count(bench.base))
    add("pruned_single", "single", lambda: single_fn(bench.pruned, fam), count(bench.pruned))
    de_params = sum(count(m) for m in bench.deep)
    seq_fn = sequential_ensemble_fn(bench.deep, fam)
    add("deep_ensemble_seq", "deep_ensemble", lambda: seq_fn, de_params)
    add(
        "deep_ensemble_vmap",
        "deep_ensemble",
        lambda: vmap_ensemble_fn(bench.deep, fam),
        de_params,
        flop_model=seq_fn,
    )
    for impl, hydra in bench.hydras.items():
        add(
            f"hydra[{impl}]",
            "hydra",
            lambda h=hydra: h,
            hydra.num_parameters(),
            implementation=impl,
        )
    add(
        "hydra[member_gemm+gemm_mlp]",
        "hydra",
        lambda: bench.hydra_gemm_mlp,
        bench.hydra_gemm_mlp.num_parameters(),
        implementation="member_gemm+gemm_mlp",
    )
    add(
        "hydra_average",
        "hydra",
        lambda: bench.average,
        bench.average.num_parameters(),
        implementation=default,
    )
    eager_default = bench.hydras[default]
    for backend in backends:

        def make(b: str = backend) -> Callable[..., Tensor]:
            artifact = bench.compiled_fn(b, inputs, max_batch, precision)
            if artifact is None:
                key = b if precision is None else f"{b}@{precision}"
                raise RuntimeError(bench.compile_errors[key])
            return artifact

        add(
            f"hydra+{backend}",
            "hydra_compiled",
            make,
            eager_default.num_parameters(),
            flop_model=eager_default,
            implementation=default,
            backend=backend,
        )
    for k, hydra in sorted(bench.shared.items()):
        add(
            f"hydra_shared{k}",
            "hydra_shared",
            lambda h=hydra: h,
            hydra.num_parameters(),
            implementation=default,
            shared_layers=k,
        )
    return rows


def run_case(
    bench: ModelBench,
    batch: int,
    seq: int | None,
    backends: list[str],
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
    max_batch: int,
    log: Callable[[str], None],
    precisions: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Measure one case; ``precisions`` None is the legacy single-dtype run (see ``case_rows``).

    With ``precisions``, the rows of every precision are timed together, round-robin; the
    reference row (``base`` at fp32, eager) is measured even when fp32 is not requested."""
    spec, dev = bench.spec, bench.device
    case = f"{spec.key} b{batch}" + (f" s{seq}" if seq else "")
    with torch.no_grad():
        if precisions is None:
            rows = case_rows(bench, batch, seq, backends, max_batch)
        else:
            rows = []
            if "fp32" not in precisions:
                rows += case_rows(bench, batch, seq, backends, max_batch, "fp32", only_base=True)
            for precision in precisions:
                rows += case_rows(bench, batch, seq, backends, max_batch, precision)

    def prepare(row: dict[str, Any]) -> None:
        row["peak_mem_mb"] = measure.peak_memory_mb(row["fn"], dev)
        row["flops"] = measure.count_flops(row.pop("flops_fn")) * batch

    time_rows(rows, dev, min_rounds, max_rounds, budget_s, prepare=prepare)
    base = rows[0]  # the reference: base at fp32 (or at --dtype in a legacy run)
    bases = {r["precision"]: r for r in rows if r["row"] == "base"}
    for row in rows:
        med = row.get("latency_ms_median")
        row["throughput_per_s"] = batch / (med / 1e3) if med else None
    out = []
    for row in rows:
        row.pop("fn", None)
        row.pop("flops_fn", None)
        med = row.get("latency_ms_median")
        for column, key in (
            ("latency_ratio", "latency_ms_median"),
            ("throughput_ratio", "throughput_per_s"),
            ("memory_ratio", "peak_mem_mb"),
            ("params_ratio", "params"),
            ("flops_ratio", "flops"),
        ):
            row[column] = ratio(row.get(key), base.get(key))
        same = bases.get(row["precision"], {}).get("latency_ms_median")
        row["same_precision_ratio"] = ratio(med, same)
        row["same_precision_over_flops"] = ratio(row["same_precision_ratio"], row["flops_ratio"])
        full = {c: row.get(c) for c in COLUMNS}
        full.update(case=case, model=spec.key, batch=batch, seq=seq)
        out.append(full)
        log(
            f"  {case:16s} {row['row']:28s} {row['precision']:4s} "
            + (
                f"{med:10.2f} ms  x{row['latency_ratio']:.2f}"
                if med
                else f"error: {row.get('error')}"
            )
        )
    return out


def machine_info(device: torch.device) -> dict[str, Any]:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": str(device),
        "load_average_start": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo") as handle:
            info["cpu_model"] = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                None,
            )
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def parse_precisions(value: str | None, device: torch.device, dtype: str) -> list[str] | None:
    """``--precisions`` as a list (None when not given). BadParameter for an unknown
    precision, fp16 off CUDA, or a ``--dtype`` other than float32 (the weights stay fp32 and
    the precision is autocast's)."""
    chosen = _csv(value)
    if not chosen:
        return None
    unknown = [p for p in chosen if p not in PRECISIONS]
    if unknown:
        raise typer.BadParameter(f"precisions must be among {list(PRECISIONS)}, got {unknown}")
    if "fp16" in chosen and device.type != "cuda":
        raise typer.BadParameter("precisions: fp16 runs only on CUDA (use fp32,bf16 on the CPU)")
    if dtype != "float32":
        raise typer.BadParameter(
            f"precisions needs --dtype float32 (weights stay fp32), got --dtype {dtype}"
        )
    return list(dict.fromkeys(chosen))


def precision_notes(precisions: list[str] | None, device: torch.device) -> dict[str, str]:
    """One line per requested precision saying whether the device runs it natively; a bf16
    without native support is still measured, and flagged by this note."""
    from hydra_ops.models.runtime import bf16_supported

    notes: dict[str, str] = {}
    for precision in precisions or []:
        if precision == "bf16":
            ok, why = bf16_supported(device)
            notes[precision] = ("native: " if ok else "EMULATED (slow, flagged): ") + why
        elif precision == "fp16":
            notes[precision] = "CUDA fp16 autocast"
        else:
            notes[precision] = "no autocast (the exact fp32 path)"
    return notes


def _csv(value: str | None) -> list[str]:
    return (
        [] if not value or value == "none" else [v.strip() for v in value.split(",") if v.strip()]
    )


def main(
    models: str = typer.Option(None, help=f"comma list of {sorted(MODELS)} (default: full set)"),
    smoke: bool = typer.Option(False, help="tiny models, 1 round: for tests (no timing claims)"),
    backends: str = typer.Option(
        None,
        help="compile backends, comma list or 'none' (default: "
        "every available one; 'none' with --smoke)",
    ),
    batches: str = typer.Option(None, help="override the batch sizes, e.g. 1,64"),
    members: int = typer.Option(3, help="M, number of members"),
    threads: int = typer.Option(2, help="torch.set_num_threads"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: str = typer.Option("float32", help=f"one of {sorted(DTYPES)}"),
    precisions: str = typer.Option(
        None,
        help="comma list of fp32, bf16 (CPU and CUDA), fp16 (CUDA): measured side by side "
        "(autocast on fp32 weights) against the reference row: single model, fp32 eager",
    ),
    seqs: str = typer.Option(None, help="override the text sequence lengths, e.g. 64"),
    budget: float = typer.Option(
        20.0, help="seconds of timed round-robin per case (after warm-up)"
    ),
    min_rounds: int = typer.Option(3, help="at least this many timed calls per row"),
    max_rounds: int = typer.Option(30, help="at most this many timed calls per row"),
    out: Path = OUT_OPTION,
    tag: str = typer.Option("", help="suffix of the output file names (results<tag>.json)"),
) -> None:
    """Run the benchmark and write ``results.json`` + ``results.md`` to ``--out``."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"device must be one of ['cpu', 'cuda'], got {device!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch.set_num_threads(threads)
    dev = torch.device(device)
    chosen_precisions = parse_precisions(precisions, dev, dtype)
    keys = _csv(models) or list(SMOKE_MODELS if smoke else FULL_MODELS)
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        raise typer.BadParameter(f"models must be among {sorted(MODELS)}, got {unknown}")
    chosen_backends = (
        _csv(backends) if backends is not None else ([] if smoke else default_backends(dev))
    )
    if smoke:
        budget, min_rounds, max_rounds = 0.0, 1, 1
    results: dict[str, Any] = {
        "format": "hydra-ens-bench/1",
        "machine": machine_info(dev),
        "config": {
            "members": members,
            "threads": threads,
            "dtype": dtype,
            "device": device,
            "budget_s": budget,
            "min_rounds": min_rounds,
            "max_rounds": max_rounds,
            "backends": chosen_backends,
            "smoke": smoke,
            "models": keys,
            "precisions": chosen_precisions,
            "precision_notes": precision_notes(chosen_precisions, dev),
        },
        "reference": {
            **REFERENCE,
            "precision": "fp32" if chosen_precisions else DTYPE_PRECISION[dtype],
        },
        "columns": list(COLUMNS),
        "models": {},
        "rows": [],
    }
    started = time.perf_counter()
    for key in keys:
        spec = MODELS[key]
        typer.echo(f"[bench] {key}: building models")
        bench = ModelBench(spec, members, dev, DTYPES[dtype])
        case_batches = [int(b) for b in _csv(batches)] or list(spec.batches)
        max_batch = max(64, *case_batches)
        case_seqs = [int(x) for x in _csv(seqs)] if seqs and is_text(spec.family) else None
        for seq in case_seqs or spec.seqs:
            for batch in case_batches:
                results["rows"] += run_case(
                    bench,
                    batch,
                    seq,
                    chosen_backends,
                    budget,
                    min_rounds,
                    max_rounds,
                    max_batch,
                    typer.echo,
                    chosen_precisions,
                )
                results["models"][key] = _model_info(bench, chosen_backends)
                _write(results, out, tag, started)  # partial results survive an interruption
    _write(results, out, tag, started)
    typer.echo(f"[bench] wrote {out}/results{tag}.json and .md in {results['elapsed_s']:.0f} s")


def _model_info(bench: ModelBench, backends: list[str]) -> dict[str, Any]:
    keys = ("backend", "precision", "compile_seconds", "bench_compile_s", "input_names")
    return {
        "default_implementation": bench.default_impl,
        "expected_rows": expected_rows(bench.spec, backends),
        "compile_errors": bench.compile_errors,
        "compiled": {b: {k: a.metadata.get(k) for k in keys} for b, a in bench.compiled.items()},
    }


def _write(results: dict[str, Any], out: Path, tag: str, started: float) -> None:
    from benchmarks.report import evaluate_targets, markdown

    results["machine"]["load_average_end"] = os.getloadavg()
    results["elapsed_s"] = time.perf_counter() - started
    results["targets"] = evaluate_targets(results)
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / f"results{tag}.json", json.dumps(results, indent=2, default=str))
    write_report(out / f"results{tag}.md", markdown(results))


def cli() -> None:
    typer.run(main)


if __name__ == "__main__":
    cli()
