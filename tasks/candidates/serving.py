"""Serving a bundle's candidate (``candidate/``, :mod:`tasks.candidates.bundle`): the model rebuilt
from its recipe and the files the evaluation scored, with the interface ``predict`` and the
prediction service use (:class:`tasks.serving.served.Served`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.candidates.bundle import check_candidate
from tasks.candidates.export import DESCRIPTION, FOLDER
from tasks.runtime.outputs import read_json


@dataclass
class ServedCandidate:
    """A bundled candidate ready to answer, with :class:`tasks.serving.served.Served`'s interface:
    ``member_logits(batch) -> [B, K, C]`` (K members; 1 for a single model), on the CPU in fp32.
    ``hydra`` is the object ``predict`` reads ``temperature`` and ``class_names`` from (itself)."""

    directory: Path
    candidate: str
    members: int
    temperature: float
    class_names: list[str]
    metadata: dict[str, Any]
    answered_by: str
    unavailable: dict[str, str]
    preprocessing: Any
    _logits: Any = field(default=None, repr=False)

    @property
    def hydra(self) -> ServedCandidate:
        return self

    @property
    def num_members(self) -> int:
        return self.members

    @property
    def architecture(self) -> dict[str, int]:
        """The two facts the prediction service reads from a model's architecture."""
        return {"num_members": self.members, "num_classes": len(self.class_names)}

    def member_logits(self, batch: dict[str, Any]) -> Any:
        import torch

        with torch.no_grad():
            return self._logits(batch).float()


def candidate_logits(folder: Path, recipe: Mapping[str, Any]) -> Any:
    """``batch -> [B, K, C]`` of the recipe's model(s), rebuilt from ``folder`` (CPU, fp32)."""
    import torch

    from hydra_ops.heads.plans import load_plans
    from hydra_ops.models.checkpoints import load_member, load_model, load_pruned
    from hydra_ops.models.inference import logits

    if recipe["kind"] == "mc_dropout":
        from hydra_ops.models.mc_dropout import mc_dropout_logits

        base = load_model(folder / recipe["checkpoint"])
        return lambda b: mc_dropout_logits(
            base,
            [b],
            recipe["samples"],
            seed=recipe["seed"],
            rate=recipe["rate"],
            implementation=recipe.get("sampler", "dense"),
        )
    if recipe["kind"] != "models":
        raise ValueError(f"unknown candidate recipe {recipe['kind']!r}; a newer release wrote it")
    models = []
    for spec in recipe["models"]:
        ckpt = folder / spec["checkpoint"]
        if spec.get("plan"):
            models.append(load_pruned(ckpt, load_plans(folder / spec["plan"])[spec["plan_index"]]))
        elif spec.get("base"):
            models.append(load_member(ckpt, folder / spec["base"]))
        else:
            models.append(load_model(ckpt))
    for m in models:
        m.eval()
    return lambda b: torch.stack([logits(m, [b]) for m in models], dim=1)


def load_candidate(directory: Path, preprocessing: Any) -> ServedCandidate:
    """The bundle's candidate, after :func:`check_candidate` against the bundled evaluation."""
    directory = Path(directory)
    desc = read_json(directory / FOLDER / DESCRIPTION, "bundled candidate")
    name = desc["name"]
    check_candidate(directory, read_json(directory / "evaluate.json", "bundled evaluation"), name)
    return ServedCandidate(
        directory=directory,
        candidate=name,
        members=int(desc["members"]),
        temperature=float(desc["temperature"]),
        class_names=list(desc["class_names"]),
        metadata={"ood_thresholds": desc["ood_thresholds"]},
        answered_by=f"{name} (eager, cpu fp32; the candidate promote.candidates shipped)",
        unavailable=dict(desc["unavailable"]),
        preprocessing=preprocessing,
        _logits=candidate_logits(directory / FOLDER, desc["recipe"]),
    )
