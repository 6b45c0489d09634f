"""The model a prediction service answers with: an immutable snapshot, and a holder that swaps it.

:class:`ModelSnapshot` is one loaded model (the bundle of the version in ``promote.stage``, verified
and loaded by :func:`tasks.serving.served.load_served`, with the params its inputs are prepared
with) and answers a list of requests with the rows of ``hydra-ens predict --json``
(:func:`tasks.serving.predict.rows_from_member_logits`). It is never changed after loading, so a
batch answered by one snapshot is answered by one version.

:class:`ModelHolder` keeps the current snapshot and watches a cheap fingerprint of what decides it
(the stage's GTO assignment tags and ``params.yaml``): when it changes (a promotion, a rollback),
the new snapshot is loaded beside the old one, which goes on answering, and then replaces it in one
reference assignment. When the registry holds no version in the stage (``gto deprecate``,
``gto unassign``, a promotion killed halfway), the holder holds a :class:`Withdrawn` instead: the
service answers no prediction until a version is promoted, never with one ``gto show`` no longer
puts in the stage. The one exception is a move of the stage under way: a promotion or rollback
unassigns the old version about a second before it assigns the new one, and for that gap
(:func:`tasks.release.model_registry.stage_move_under_way`, at most ``MOVE_GRACE_S`` = 10 s) the old
version answers on, so a promotion costs no refused request. Any other load that fails (a bundle
that does not verify or is not in the cache, a registry that cannot be read) leaves the old snapshot
serving and is reported in :attr:`ModelHolder.reload_error`.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.release.model_registry import NoVersionInStage

log = logging.getLogger("hydra_ens")

#: Largest forward batch when the artifact records none (the compile stage's default).
DEFAULT_MAX_BATCH = 64


@dataclass(frozen=True)
class ModelSnapshot:
    """One loaded model and everything its answers need; never mutated after loading.

    Attributes:
        version: the registry version (``v0.0.3``), or a label for a model served from a folder.
        record: the registry record of that version (``{}`` for a folder).
        served: ``member_logits(batch) -> [B, M, C]`` (:class:`tasks.serving.served.Served` or
            :class:`SingleModel`).
        cfg: the params its inputs are prepared with (tokenizer, ``max_length``, image size).
        thresholds: the OOD verdict thresholds stored in the model (None: none stored).
        max_batch: inputs per forward pass (a compiled artifact's ``max_batch``).
        members, classes: ``M`` and ``C`` of its ``[B, M, C]`` logits.
        runtime: where the eager model runs (``runtime.device``/``precision`` of ``cfg``).
        loaded_at: UTC time of loading (ISO 8601).
    """

    version: str
    record: dict[str, Any]
    served: Any
    cfg: Any
    thresholds: Any
    max_batch: int
    members: int
    classes: int
    runtime: Any
    loaded_at: str

    @property
    def answered_by(self) -> str:
        """What computes the logits, as ``predict`` says it (the eager model on a runtime that
        is not the default one names it)."""
        by = str(self.served.answered_by)
        if self._eager_runtime() is not None:
            by += f" on {self.runtime.device} {self.runtime.precision}"
        return by

    def _eager_runtime(self) -> Any:
        """The runtime the eager model runs on when it is not ``Served.member_logits``'s own (the
        CPU in fp32), else None (:func:`tasks.serving.predict._member_logits`'s rule)."""
        eager = str(self.served.answered_by).startswith("eager")
        return None if self.runtime.is_default or not eager else self.runtime

    def _member_logits(self, batch: dict[str, Any]) -> Any:
        from hydra_ops.models.inference import logits

        runtime = self._eager_runtime()
        if runtime is None:
            return self.served.member_logits(batch)
        return logits(
            self.served.hydra, [batch], device=runtime.device, precision=runtime.precision
        )

    def warm_up(self) -> None:
        """One answer to a throw-away text, so the first real request does not pay for lazy
        set-up (a compiled artifact's first call compiles). Image models: nothing to send."""
        if self.cfg.modality == "text":
            self.rows(["warm-up"])

    def warm_shapes(
        self, max_batch: int, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Run the model once on every batch shape a service with forward passes of at most
        ``max_batch`` inputs meets (:func:`tasks.serving.warmup.warm_up`); returns how many."""
        from tasks.serving.warmup import warm_up

        forward = min(max_batch, self.max_batch)
        return warm_up(self._member_logits, self.served.preprocessing, forward, progress)

    def legend(self) -> str:
        """The one-line units/thresholds text of ``predict``'s table."""
        from tasks.serving.predict import legend

        kind = self.thresholds.score if self.thresholds is not None else self.cfg.evaluate.ood_score
        return legend(self.classes, self.members, kind, self.thresholds)

    def rows(self, inputs: Sequence[str], max_batch: int | None = None) -> list[dict[str, Any]]:
        """The rows of ``hydra-ens predict --json`` for ``inputs`` (ValueError on a bad input),
        in forward passes of at most :attr:`max_batch` (and ``max_batch``) inputs."""
        import torch

        from tasks.serving.predict import _batch, rows_from_member_logits, validate_inputs

        inputs = validate_inputs(inputs)
        pre = self.served.preprocessing
        size = min(self.max_batch, max_batch or self.max_batch)
        chunks = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        logits = torch.cat([self._member_logits(_batch(pre, chunk)) for chunk in chunks])
        return rows_from_member_logits(
            inputs,
            logits,
            temperature=float(self.served.hydra.temperature),
            class_names=self.served.hydra.class_names,
            thresholds=self.thresholds,
            default_score_kind=self.cfg.evaluate.ood_score,
            answered_by=self.answered_by,
            model_version=self.version,
            preprocessing=pre.describe(),
            candidate=getattr(self.served, "candidate", "hydra"),
            unavailable=getattr(self.served, "unavailable", None),
        )

    def answer(
        self, requests: list[list[str]], max_batch: int | None = None
    ) -> list[list[dict[str, Any]] | ValueError]:
        """Rows for each request, from one forward pass over all of them when they are all
        valid (passes of at most ``max_batch`` inputs); a request with a bad input gets its
        ValueError and the others their rows."""
        flat = [text for request in requests for text in request]

        def rows(texts: Sequence[str]) -> list[dict[str, Any]]:
            return self.rows(texts, max_batch)

        try:
            out_rows = rows(flat)
        except ValueError:
            if len(requests) == 1:
                return [_error(rows, requests[0])]
            return [_error(rows, request) for request in requests]
        out: list[list[dict[str, Any]] | ValueError] = []
        start = 0
        for request in requests:
            out.append(out_rows[start : start + len(request)])
            start += len(request)
        return out


@dataclass(frozen=True)
class Withdrawn:
    """What a :class:`ModelHolder` holds once the registry puts no version in the stage: no
    model, and the one line every request is refused with.

    Attributes:
        version: the version that answered until then.
        reason: why nothing answers, one line (names the version and the registry's state).
        since: UTC time of the withdrawal (ISO 8601).
    """

    version: str
    reason: str
    since: str


def _error(rows: Callable[[Sequence[str]], list[dict[str, Any]]], request: list[str]) -> Any:
    try:
        return rows(request)
    except ValueError as err:
        return err


class SingleModel:
    """A plain classifier (``models/base``, the single model) as a one-member model:
    ``member_logits(batch) -> [B, 1, C]``; for serving it beside Hydra (benchmarks)."""

    def __init__(self, directory: Path, preprocessing: Any, temperature: float = 1.0) -> None:
        import torch

        from hydra_ops.models.checkpoints import load_model

        self.model = load_model(directory).eval()
        self.preprocessing = preprocessing  # the prod bundle's: the same run's inputs
        self.temperature = torch.tensor(float(temperature))
        labels = getattr(getattr(self.model, "config", None), "id2label", None)
        self.class_names = [labels[i] for i in sorted(labels)] if labels else None
        self.hydra = self  # what the row builder reads temperature / class_names from
        self.answered_by = f"eager (single model {directory.name}, cpu fp32)"  # CPU, fp32 only
        self.num_classes = int(self.model.config.num_labels)

    def member_logits(self, batch: dict[str, Any]) -> Any:
        import torch

        from hydra_ops.compile import arrange_inputs, input_names_of

        with torch.no_grad():
            out = self.model(*arrange_inputs(batch, input_names_of(batch)))
        out = getattr(out, "logits", out)
        return out.float()[:, None, :]


def _runtime(cfg: Any) -> Any:
    from hydra_ops.models.runtime import Runtime

    return Runtime.from_spec(cfg.runtime.device, cfg.runtime.precision)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_prod_snapshot(root: Path) -> ModelSnapshot:
    """The model in ``promote.stage`` of the project at ``root``, with its params (ValueError
    when there is none or it does not verify)."""
    from hydra_ops.uq.ood_thresholds import OodThresholds
    from tasks.params.schema import load_params
    from tasks.release.model_registry import resolve_prod_dir
    from tasks.serving.served import load_served

    cfg = load_params(root / "params.yaml")
    bundle_dir, record = resolve_prod_dir(root, cfg.promote.model_name, cfg.promote.stage)
    served = load_served(bundle_dir)
    stored = served.metadata.get("ood_thresholds")
    compiled = served.directory / "compiled" / "compiled.json"
    max_batch = DEFAULT_MAX_BATCH
    if compiled.is_file():
        from tasks.runtime.outputs import read_json

        max_batch = int(read_json(compiled, "compiled artifact").get("max_batch", max_batch))
    return ModelSnapshot(
        version=record["version"],
        record=record,
        served=served,
        cfg=cfg,
        thresholds=OodThresholds.from_metadata(stored) if stored is not None else None,
        max_batch=max_batch,
        members=int(served.hydra.num_members),
        classes=int(served.hydra.architecture["num_classes"]),
        runtime=_runtime(cfg),
        loaded_at=_utc_now(),
    )


def load_single_snapshot(root: Path) -> ModelSnapshot:
    """The project's single model (``models/base``) with the temperature the evaluate stage
    fitted for it, the preprocessing of the prod bundle (the same run's), its scores from
    ``evaluate.ood_score`` and no verdict thresholds."""
    from hydra_ops.models.runtime import Runtime
    from tasks.params.schema import load_params
    from tasks.runtime.layout import BASE, METRICS
    from tasks.runtime.outputs import read_json

    cfg = load_params(root / "params.yaml")
    if not (root / BASE).is_dir():
        raise ValueError(f"{root / BASE}: no single model here; run the pipeline first")
    temperature = 1.0
    if (root / METRICS / "evaluate.json").is_file():
        ev = read_json(root / METRICS / "evaluate.json", "evaluate output")
        temperature = float(ev.get("models", {}).get("single", {}).get("temperature", 1.0))
    from tasks.release.model_registry import resolve_prod_dir
    from tasks.release.preprocessing import load_preprocessing

    bundle_dir, _ = resolve_prod_dir(root, cfg.promote.model_name, cfg.promote.stage)
    single = SingleModel(root / BASE, load_preprocessing(bundle_dir), temperature)
    return ModelSnapshot(
        version="single",
        record={},
        served=single,
        cfg=cfg,
        thresholds=None,
        max_batch=DEFAULT_MAX_BATCH,
        members=1,
        classes=single.num_classes,
        runtime=Runtime.from_spec("cpu", "fp32"),  # SingleModel runs where it was loaded
        loaded_at=_utc_now(),
    )


def stage_fingerprint(root: Path) -> str:
    """What decides the served model, cheaply: the project's ``params.yaml`` (size, mtime) and
    every GTO tag ref (name and object), so a promotion or rollback changes it. One ``git
    for-each-ref`` (a few ms)."""
    params = root / "params.yaml"
    st = params.stat() if params.is_file() else None
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/tags"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return f"{st and (st.st_size, st.st_mtime_ns)}\n{refs.returncode}\n{refs.stdout}"


class ModelHolder:
    """The current :class:`ModelSnapshot`, swapped atomically when ``fingerprint()`` changes, or
    a :class:`Withdrawn` once the registry holds no version in the stage (see the module doc).

    :attr:`current` is the one reference readers take; it is replaced, never mutated.
    :attr:`moving` names the move of the stage the old version answers through (None when none).

    Args:
        load: builds a snapshot (ValueError/OSError on failure;
        :class:`tasks.release.model_registry.
            NoVersionInStage` when the stage is empty).
        fingerprint: a cheap string that changes when ``load`` would load another model; None:
            the model never changes (no watcher thread).
        poll_s: seconds between two fingerprints.
    """

    def __init__(
        self,
        load: Callable[[], ModelSnapshot],
        fingerprint: Callable[[], str] | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self._load, self._fingerprint, self.poll_s = load, fingerprint, poll_s
        #: how a newly loaded snapshot is warmed before it answers (a service warms every shape)
        self.warm: Callable[[ModelSnapshot], Any] = ModelSnapshot.warm_up
        self._seen = fingerprint() if fingerprint else ""
        self.current: ModelSnapshot | Withdrawn = self._load_warm()
        self.reloads = 0
        self.reload_error: str | None = None
        self.moving: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if fingerprint is not None:
            self._thread = threading.Thread(target=self._watch, name="model-watcher", daemon=True)
            self._thread.start()

    def check(self) -> bool:
        """Reload when the fingerprint changed; True when a new snapshot was swapped in."""
        if self._fingerprint is None:
            return False
        seen = self._fingerprint()
        if seen == self._seen:
            return False
        try:
            fresh = self._load_warm()
        except NoVersionInStage as err:
            return self._stage_empty(err, seen)
        except (ValueError, OSError) as err:  # the old snapshot goes on answering
            why = f"{type(err).__name__}: {err}"
            if why != self.reload_error:
                still = "nothing" if isinstance(self.current, Withdrawn) else self.current.version
                log.error("reload failed, still serving %s: %s", still, why)
            self.reload_error = why
            return False
        old, self.current, self._seen = self.current, fresh, seen
        self.reloads += 1
        self.reload_error = self.moving = None
        if old.version != fresh.version or isinstance(old, Withdrawn):
            log.info("now serving %s (was %s)", fresh.version, old.version)
        return True

    def _stage_empty(self, err: NoVersionInStage, seen: str) -> bool:
        """The registry holds no version in the stage: the current snapshot answers on only
        through a move of the stage away from it (``err.move``), else it is withdrawn; True when
        it was withdrawn now."""
        current = self.current
        move = err.move
        if isinstance(current, ModelSnapshot) and move and move["from"] == current.version:
            self.moving = f"{move['from']} -> {move['to']} ({move['tag']})"
            return False  # _seen unchanged: looked at again next poll, until the move ends
        if self._fingerprint is not None and self._fingerprint() != seen:
            # the tags changed while they were read (a move that ended between reading the stage
            # and reading the move): decide on the next poll, from one state
            return False
        self.moving = None
        self._seen = seen
        if isinstance(current, Withdrawn):
            return False
        name = current.record.get("tag") or current.version
        self.current = Withdrawn(current.version, f"not serving {name}: {err}", _utc_now())
        log.error("%s", self.current.reason)
        return True

    def _load_warm(self) -> ModelSnapshot:
        snapshot = self._load()
        self.warm(snapshot)  # beside the snapshot still answering: the swap costs no request
        return snapshot

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # never let the watcher die: log it, try again next poll
                log.exception("checking for a new model failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 + self.poll_s)
