"""Loading a bundle back to serve it: every file verified against ``bundle.json`` (an edited
``hydra.json`` is refused like edited weights), then the compiled artifact when its backend runs on
this machine (checked at load: backend importable, device present, artifact loads) and the eager
model otherwise; :attr:`Served.answered_by` says which one answered. A bundle that ships another
candidate (``promote.candidates``) is served by :class:`tasks.candidates.serving.ServedCandidate`,
whose ``answered_by`` names it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.candidates.serving import ServedCandidate, load_candidate
from tasks.release.bundle_format import MANIFEST, verify_bundle
from tasks.release.custody import check_bundle
from tasks.release.preprocessing import Preprocessing, load_preprocessing
from tasks.runtime.outputs import read_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger("hydra_ens")


@dataclass
class Served:
    """A verified bundle ready to answer: ``member_logits(batch) -> [B, M, C]``."""

    directory: Path
    hydra: Any
    metadata: dict[str, Any]
    answered_by: str
    _compiled: Callable[[dict], torch.Tensor] | None = field(default=None, repr=False)
    #: how inputs become model inputs, as shipped (:mod:`tasks.release.preprocessing`)
    preprocessing: Preprocessing | None = None
    #: the candidate that answers, and the ``predict`` columns it cannot give (none: the Hydra)
    candidate: str = "hydra"
    unavailable: dict[str, str] = field(default_factory=dict)

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


def load_served(directory: Path, prefer_compiled: bool = True) -> Served | ServedCandidate:
    """Verify and load a bundle (see the module docstring). A bundle that ships a candidate
    other than the Hydra (``bundle.json``'s ``candidate``) answers with that candidate, after
    every file, the chain of custody and its ``candidate/`` files are checked."""
    from hydra_ops.hydra.serialization import load_hydra, read_hydra_config

    directory = Path(directory)
    if read_json(directory / MANIFEST, "bundle").get("candidate", "hydra") != "hydra":
        verify_bundle(directory)
        check_bundle(directory)  # compiled/ <- model/, evaluate.json <- both
        return load_candidate(directory, load_preprocessing(directory))
    manifest = verify_bundle(directory, skip=MODEL_FILES)  # load_hydra checks those two
    hydra = load_hydra(
        directory / "model",
        expected_config_sha256=manifest["files"]["model/hydra.json"],
        expected_weights_sha256=manifest["files"]["model/model.safetensors"],
    )
    check_bundle(directory)  # compiled/ <- model/, evaluate.json <- both
    metadata = dict(read_hydra_config(directory / "model").get("metadata", {}))
    runner, answered_by = (None, "eager (requested)")
    if prefer_compiled:
        runner, answered_by = _compiled_runner(directory / "compiled")
    return Served(directory, hydra, metadata, answered_by, runner, load_preprocessing(directory))
