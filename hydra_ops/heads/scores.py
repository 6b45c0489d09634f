"""Head importance of one model: :class:`HeadScores`, ``[layers, heads]``, higher = more important.

What an importance criterion (:mod:`hydra_ops.scoring`) returns and what
:mod:`hydra_ops.heads.selection` reads; saved as one safetensors file with its JSON metadata.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from hydra_ops.atomic import atomic_write_file
from hydra_ops.heads.plans import HeadPlan

_FORMAT = "hydra-ens/head-scores/v1"


@dataclass
class HeadScores:
    """Head importance of one model.

    Attributes:
        scores: ``[L, H]`` float32, higher = more important, finite.
        method: the criterion's registered name (one of :data:`hydra_ops.scoring.SCORERS`).
        meta: JSON-serialisable details (parameters, data sizes, per-circuit objectives, overlap).
        circuits: for ``circuit`` only, the M plans found (``heads_per_layer`` heads per layer).
    """

    scores: Tensor
    method: str
    meta: dict[str, Any] = field(default_factory=dict)
    circuits: list[HeadPlan] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.scores, Tensor) or self.scores.dim() != 2:
            raise ValueError("HeadScores.scores must be a [layers, heads] tensor")
        if not self.scores.is_floating_point():
            raise ValueError(f"HeadScores.scores must be a float tensor, got {self.scores.dtype}")
        if not torch.isfinite(self.scores).all():
            raise ValueError("HeadScores.scores must be finite (no NaN or inf)")
        self.scores = self.scores.detach().to("cpu", torch.float32).contiguous()
        if self.circuits is not None:
            for plan in self.circuits:
                plan.validate_for([self.num_heads] * self.num_layers)

    @property
    def num_layers(self) -> int:
        return int(self.scores.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.scores.shape[1])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write one safetensors file (tensor ``scores`` + JSON metadata), atomically."""
        path = Path(path)
        header = {
            "format": _FORMAT,
            "method": self.method,
            "meta": self.meta,
            "circuits": None if self.circuits is None else [p.to_dict() for p in self.circuits],
        }
        try:
            metadata = {"hydra_head_scores": json.dumps(header, allow_nan=False)}
        except (TypeError, ValueError) as err:
            raise ValueError(f"HeadScores.meta must be JSON-serialisable: {err}") from err
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_file(
            path,
            lambda tmp: save_file({"scores": self.scores}, str(tmp), metadata=metadata),
            keep_suffix=False,
        )
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HeadScores:
        """Read a file written by :meth:`save`."""
        from safetensors import safe_open

        path = Path(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
            tensors = load_file(str(path))
        except Exception as err:
            raise ValueError(
                f"{path} is not a readable head-scores safetensors file: {err}"
            ) from err
        raw = metadata.get("hydra_head_scores")
        if raw is None or "scores" not in tensors:
            raise ValueError(f"{path} is a safetensors file but not one written by HeadScores.save")
        header = json.loads(raw)
        if header.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown head-scores format {header.get('format')!r}")
        circuits = header.get("circuits")
        return cls(
            scores=tensors["scores"],
            method=header["method"],
            meta=header.get("meta") or {},
            circuits=None if circuits is None else [HeadPlan.from_dict(c) for c in circuits],
        )
