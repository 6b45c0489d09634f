"""What ``hydra-ens run``, ``stage`` and ``study`` check before anything is written: the params
resolve and validate, name what the library has, and ask for nothing this machine cannot run.

No stage imports this module (it resolves ``--set`` values and imports the library's
registries); each check raises :class:`~tasks.params.base.ConfigError` (one line naming the key)
or ValueError, which the CLI prints as its one error line (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from tasks.params.base import ConfigError
from tasks.params.files import read_yaml
from tasks.params.names import check_names
from tasks.params.overrides import apply_sets, deep_merge, parse_sets, resolve_params
from tasks.params.schema import PipelineConfig, load_params


def resolve_run_params(
    root: Path, profile: str | None, params: Path | None, sets: list[str]
) -> PipelineConfig | None:
    """The ``params.yaml`` that ``run`` is to write, validated; None when no option is given (the
    current file is validated as it is). ConfigError on bad input; nothing is written here.

    ``--profile``/``--params``: defaults, then the profile (given, else the file's ``profile``
    key, else ``default``), then the file. ``--set`` alone edits the current ``params.yaml``,
    keeping its hand edits (:func:`tasks.params.overrides.apply_sets`: a new ``data.name`` brings
    its source defaults). The result must also run here (:func:`check_runs_here`: the stages of
    ``run`` run on this machine).
    """
    current = root / "params.yaml"
    if profile is None and params is None:
        if not sets:
            check_runs_here(load_params(current))  # validate what is there
            return None
        cfg = apply_sets(read_yaml(current), parse_sets(sets), root)
    else:
        overrides = read_yaml(params) if params is not None else None
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(f"{params}: <root>: must be a mapping")
        if profile is None:
            profile = (overrides or {}).get("profile", "default")
        overrides = deep_merge(overrides or {}, {"profile": profile})
        cfg = resolve_params(profile, overrides, parse_sets(sets), root)
    check_runs_here(cfg)
    return cfg


def check_runs_here(cfg: PipelineConfig) -> None:
    """ConfigError when ``cfg`` names what the library lacks (:func:`tasks.params.names.
    check_names`) or what this machine cannot run: a CUDA device it lacks
    (:func:`check_device_here`) or a compile precision the compile stage would refuse here
    (:func:`check_compile_here`)."""
    check_names(cfg)
    check_device_here(cfg)
    check_compile_here(cfg)


def check_device_here(cfg: PipelineConfig) -> None:
    """ConfigError naming ``runtime.device`` when it is a CUDA device this machine lacks, before
    any stage starts (else the first model stage would find out after the data stage ran).
    torch is imported only for a ``cuda``/``cuda:N`` spec; ``auto`` and ``cpu`` always resolve."""
    spec = cfg.runtime.device.strip()
    if not spec.startswith("cuda"):
        return
    from hydra_ops.models.runtime import resolve_device

    try:
        resolve_device(spec)
    except ValueError as err:
        raise ConfigError(f"params: runtime.{err}") from None


def check_compile_here(cfg: PipelineConfig) -> None:
    """ConfigError naming ``compile.precision`` when the compile stage would refuse it here with
    ``compile.backend`` (else a CompileError at the end of a run, after every model is trained).

    The rule is :func:`hydra_ops.compile.compile_model`'s for :mod:`tasks.compile`, which loads
    ``models/hydra`` on the CPU, through the library's own checks: whether the precision runs on
    the device the backend compiles on (:func:`hydra_ops.compile.precision.
    precision_unavailable_reason`; ``auto``/``tensorrt``: CUDA when Torch-TensorRT is usable, else
    the CPU; ``inductor``/``export``/``onnxruntime``: the CPU, whatever ``runtime.device`` says),
    then the backend's own precision rule (onnxruntime has no bf16 on the CPU). fp16 thus needs
    Torch-TensorRT on CUDA. ``eager`` compiles nothing and precision ``auto`` picks what runs:
    neither is refused. torch is imported only for an explicit precision.
    """
    backend, precision = cfg.compile.backend, cfg.compile.precision
    if backend == "eager" or precision == "auto":
        return
    import torch

    from hydra_ops.compile.backends import get_backend
    from hydra_ops.compile.backends.tensorrt import tensorrt_unavailable_reason
    from hydra_ops.compile.precision import precision_unavailable_reason

    cpu = torch.device("cpu")  # tasks.compile: load_hydra(...) maps the weights to the CPU
    why = None
    if backend in ("auto", "tensorrt"):
        trt = tensorrt_unavailable_reason()
        device = torch.device("cuda") if trt is None else cpu
        if (reason := precision_unavailable_reason(precision, device)) is not None:
            why = f"precision {precision!r} cannot run on {device}: {reason}"
            why += f" (compile.backend {backend!r}: tensorrt unavailable, {trt})" if trt else ""
    elif (reason := precision_unavailable_reason(precision, cpu)) is not None:
        why = f"precision {precision!r} cannot run on cpu: {reason} (compile.backend {backend!r} "
        why += "compiles on the CPU)"
    else:
        chosen = get_backend(backend)
        device = torch.device(chosen.device) if chosen.device is not None else cpu
        if (reason := chosen.precision_reason(precision, device)) is not None:
            why = f"compile.backend {backend!r} cannot run {precision!r} here: {reason}"
    if why is not None:
        raise ConfigError(f"params: compile.precision: {why}; use auto or fp32")


def check_allocator() -> None:
    """ValueError (one line) when ``HYDRA_ENS_MALLOC`` (the stage processes' allocator,
    :mod:`hydra_ops.perf.allocators`) is unknown or not installed, before anything is written."""
    from hydra_ops.perf.allocators import allocator_env

    allocator_env()


def parse_resources(items: list[str]) -> dict[str, float]:
    """``--resource NAME=AMOUNT`` items (Dask resources a study point needs) as a dict;
    ConfigError naming the item when one is not ``NAME=AMOUNT``."""
    resources: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            resources[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ConfigError(f"--resource {item!r}: expected NAME=AMOUNT (e.g. GPU=1)")
    return resources
