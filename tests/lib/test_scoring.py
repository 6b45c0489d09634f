"""Head scoring on a tiny random BERT: taylor, circuit, magnitude, random, HeadScores IO."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_models import FAMILIES, tiny_inputs, tiny_model
from transformers import BertConfig, BertForSequenceClassification

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.gating import head_gates
from hydra_ops.heads.plans import HeadPlan, plan_overlap
from hydra_ops.scoring import (
    METHODS,
    SCORERS,
    CircuitImportance,
    HeadImportance,
    HeadScores,
    MagnitudeImportance,
    RandomImportance,
    TaylorImportance,
    circuit_scores,
    get_scorer,
    magnitude_scores,
    random_scores,
    register_scorer,
    score_heads,
    scorer_arguments,
    taylor_scores,
)

L, H, C = 2, 4, 3


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(
        hidden_size=32,
        num_hidden_layers=L,
        num_attention_heads=H,
        intermediate_size=64,
        vocab_size=100,
        num_labels=C,
    )
    return BertForSequenceClassification(cfg).eval()


def _batch(n: int, seed: int, labels: bool = True, length: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[: n // 2, length - 3 :] = 0  # some padded rows
    batch = {"input_ids": torch.randint(100, (n, length), generator=g), "attention_mask": mask}
    if labels:
        batch["labels"] = torch.randint(C, (n,), generator=g)
    return batch


@pytest.fixture(scope="module")
def model() -> BertForSequenceClassification:
    return _model()


@pytest.fixture(scope="module")
def val() -> list[dict[str, torch.Tensor]]:
    return [_batch(24, 100)]


@pytest.fixture(scope="module")
def ood() -> list[dict[str, torch.Tensor]]:
    return [_batch(24, 200, labels=False)]


@pytest.fixture(scope="module")
def circuit_run(model, val, ood):
    events: list[dict] = []
    hs = score_heads(
        model,
        "circuit",
        val_batches=val,
        ood_val_batches=ood,
        num_circuits=3,
        heads_per_layer=2,
        progress=False,
        callback=events.append,
    )
    return hs, events


# ----- taylor ---------------------------------------------------------------------------------
def test_taylor_shape_sign_and_normalisation(model) -> None:
    batches = [_batch(8, i) for i in range(2)]
    hs = score_heads(model, "taylor", train_batches=batches, progress=False)
    assert hs.method == "taylor"
    assert hs.scores.shape == (L, H)
    assert torch.isfinite(hs.scores).all()
    assert (hs.scores >= 0).all()
    assert torch.allclose(hs.scores.norm(dim=1), torch.ones(L), atol=1e-5)
    assert all(p.grad is None for p in model.parameters())
    raw = score_heads(model, "taylor", train_batches=batches, normalize=False, progress=False)
    assert not torch.allclose(raw.scores.norm(dim=1), torch.ones(L), atol=1e-3)
    assert torch.allclose(raw.scores / raw.scores.norm(dim=1, keepdim=True), hs.scores, atol=1e-5)


def _loop_gate_grads(model, batch) -> torch.Tensor:
    """[B, L, H]: ``dL_i/dxi`` of each example on its own, one forward/backward per example."""
    adapter = get_adapter(model)
    size = batch["labels"].shape[0]
    layers, heads = adapter.num_layers, adapter.num_heads(0)
    grads = []
    for i in range(size):
        row = {k: v[i : i + 1] for k, v in batch.items()}
        gates = torch.ones(layers, heads, dtype=torch.float64, requires_grad=True)
        with head_gates(model, gates):
            loss = F.cross_entropy(adapter.logits(row), row["labels"])
        grads.append(torch.autograd.grad(loss, gates)[0])
    return torch.stack(grads)


def test_taylor_averages_per_example_absolute_gradients() -> None:
    """Michel et al.: mean over examples of |dL_i/dxi|, not |d(batch-mean loss)/dxi| per batch."""
    model = tiny_model("bert").double()
    batches = [_batch(6, 7, length=9), _batch(5, 8, length=9)]
    hs = score_heads(model, "taylor", train_batches=batches, normalize=False, progress=False)
    per_example = torch.cat([_loop_gate_grads(model, b) for b in batches])  # [11, L, H]
    expected = per_example.abs().mean(0)
    assert hs.meta["num_examples"] == 11
    torch.testing.assert_close(hs.scores.double(), expected, rtol=1e-6, atol=1e-6)
    # the old per-batch definition: |gradient of the batch-mean loss|, averaged over batches
    per_batch = torch.stack([_loop_gate_grads(model, b).mean(0).abs() for b in batches]).mean(0)
    signs_differ = (per_example > 0).any(0) & (per_example < 0).any(0)
    assert signs_differ.any()  # some head helps some examples and hurts others
    assert (expected >= per_batch - 1e-12).all()
    gap = (expected - per_batch)[signs_differ]
    assert gap.max() > 0.05 * expected.max()  # cancellation inside a batch is no longer counted
    assert not torch.allclose(hs.scores.double(), per_batch, rtol=1e-3)


def test_taylor_matches_per_example_finite_differences() -> None:
    model = _model().double()
    batch = _batch(4, 7)
    hs = score_heads(model, "taylor", train_batches=[batch], normalize=False, progress=False)
    adapter = get_adapter(model)

    def loss_at(gate_value: float, layer: int, head: int, i: int) -> float:
        gates = torch.ones(L, H, dtype=torch.float64)
        gates[layer, head] = gate_value
        row = {k: v[i : i + 1] for k, v in batch.items()}
        with torch.no_grad(), head_gates(model, gates):
            return float(F.cross_entropy(adapter.logits(row), row["labels"]))

    eps = 1e-5
    for layer, head in [(0, 1), (1, 3)]:
        fd = [
            (loss_at(1 + eps, layer, head, i) - loss_at(1 - eps, layer, head, i)) / (2 * eps)
            for i in range(4)
        ]
        expected = sum(abs(g) for g in fd) / 4
        assert hs.scores[layer, head].item() == pytest.approx(expected, rel=1e-4, abs=1e-7)


def test_taylor_needs_labelled_train_batches(model) -> None:
    with pytest.raises(ValueError, match="train_batches"):
        score_heads(model, "taylor")
    with pytest.raises(ValueError, match=r"train_batches.*labels"):
        score_heads(model, "taylor", train_batches=[_batch(4, 0, labels=False)])


# ----- circuit --------------------------------------------------------------------------------
def test_circuit_keeps_k_heads_and_circuits_differ(circuit_run) -> None:
    hs, _ = circuit_run
    assert hs.method == "circuit"
    assert hs.scores.shape == (L, H)
    assert torch.isfinite(hs.scores).all()
    assert hs.circuits is not None and len(hs.circuits) == 3
    for plan in hs.circuits:
        assert plan.num_kept() == [2] * L
    overlap = plan_overlap(hs.circuits)
    assert overlap.overall < 1.0
    assert hs.meta["jaccard_mean"] == pytest.approx(overlap.overall)
    assert [c["objective"] for c in hs.meta["circuits"]] == ["nll", "ood", "avg"]
    per = torch.tensor(hs.meta["per_circuit_importance"])
    assert torch.allclose(per.mean(0).float(), hs.scores, atol=1e-6)


def test_circuit_progress_callback_called_per_evaluation(circuit_run) -> None:
    _, events = circuit_run
    assert len(events) == L * H * 3
    assert [e["done"] for e in events] == list(range(1, L * H * 3 + 1))
    assert {(e["circuit"], e["layer"], e["head"]) for e in events} == {
        (c, layer, h) for c in range(3) for layer in range(L) for h in range(H)
    }


def test_circuit_is_deterministic_per_seed(model, val, ood, circuit_run) -> None:
    hs, _ = circuit_run
    again = score_heads(
        model,
        "circuit",
        val_batches=val,
        ood_val_batches=ood,
        num_circuits=3,
        heads_per_layer=2,
        progress=False,
    )
    assert again.circuits == hs.circuits
    assert torch.equal(again.scores, hs.scores)


def _relative_nll_increase(model, batch, layer: int) -> torch.Tensor:
    """[H]: ``(NLL with head h of ``layer`` gated off - NLL) / NLL``, all other heads on."""
    adapter = get_adapter(model)

    def nll(gates: torch.Tensor) -> float:
        with torch.no_grad(), head_gates(model, gates):
            return float(F.cross_entropy(adapter.logits(batch), batch["labels"]))

    full = nll(torch.ones(L, H))
    increases = []
    for h in range(H):
        gates = torch.ones(L, H)
        gates[layer, h] = 0
        increases.append((nll(gates) - full) / full)
    return torch.tensor(increases)


def test_circuit_matches_a_hand_computed_first_layer(model, val) -> None:
    hs = score_heads(
        model,
        "circuit",
        val_batches=val,
        num_circuits=1,
        heads_per_layer=1,
        objective="nll",
        bootstrap=False,
        progress=False,
    )
    expected_t = _relative_nll_increase(model, val[0], layer=0)
    assert torch.allclose(hs.scores[0], expected_t, atol=1e-5)
    assert hs.circuits[0].heads(0) == (int(expected_t.argmax()),)


def test_circuit_without_diversity_mechanisms_repeats_itself(model, val) -> None:
    hs = score_heads(
        model,
        "circuit",
        val_batches=val,
        num_circuits=2,
        heads_per_layer=2,
        objective="nll",
        bootstrap=False,
        overlap_penalty=0.0,
        progress=False,
    )
    assert hs.circuits[0] == hs.circuits[1]
    assert plan_overlap(hs.circuits).overall == 1.0


def test_circuit_bad_input(model, val) -> None:
    with pytest.raises(ValueError, match="val_batches"):
        score_heads(model, "circuit", heads_per_layer=2)
    for k in (0, H + 1):
        with pytest.raises(ValueError, match=rf"heads_per_layer.*1\.\.{H}"):
            score_heads(model, "circuit", val_batches=val, heads_per_layer=k)
    with pytest.raises(ValueError, match="ood_val_batches"):
        score_heads(model, "circuit", val_batches=val, objective="ood")
    with pytest.raises(ValueError, match=r"objective.*nll, ood, avg"):
        score_heads(model, "circuit", val_batches=val, objective="acc")
    with pytest.raises(ValueError, match="num_circuits"):
        score_heads(model, "circuit", val_batches=val, num_circuits=0)
    with pytest.raises(ValueError, match="overlap_penalty"):
        score_heads(model, "circuit", val_batches=val, overlap_penalty=-1.0)
    for bad in (-1, L, 1.5):
        with pytest.raises(ValueError, match=rf"shared_layers.*0\.\.{L - 1}"):
            score_heads(model, "circuit", val_batches=val, shared_layers=bad)


def test_circuit_with_a_shared_trunk_searches_only_the_later_layers(model, val, ood) -> None:
    """shared_layers = 1: layer 0 keeps every head in every circuit and is never evaluated; layer
    1 is searched with the whole trunk on, so its importances are those of gating it alone."""
    events: list[dict] = []
    hs = score_heads(
        model,
        "circuit",
        val_batches=val,
        num_circuits=2,
        heads_per_layer=1,
        objective="nll",
        bootstrap=False,
        progress=False,
        shared_layers=1,
        callback=events.append,
    )
    assert {e["layer"] for e in events} == {1} and events[-1]["total"] == 2 * (L - 1) * H
    assert all(plan.heads(0) == tuple(range(H)) for plan in hs.circuits)
    assert all(len(plan.heads(1)) == 1 for plan in hs.circuits)
    assert torch.equal(hs.scores[0], torch.zeros(H)) and hs.meta["shared_layers"] == 1
    per_circuit = torch.tensor(hs.meta["per_circuit_importance"])
    expected = _relative_nll_increase(model, val[0], layer=1)
    assert torch.allclose(per_circuit[0, 1].float(), expected, atol=1e-5)


def test_circuit_search_trunk_is_the_full_search_with_the_trunk_restored(model, val, ood) -> None:
    common = dict(val_batches=val, ood_val_batches=ood, num_circuits=3, heads_per_layer=1)
    full = score_heads(model, "circuit", progress=False, **common)
    kept = score_heads(
        model, "circuit", progress=False, shared_layers=1, search_trunk=True, **common
    )
    assert [p.kept[1:] for p in kept.circuits] == [p.kept[1:] for p in full.circuits]
    assert all(p.heads(0) == tuple(range(H)) for p in kept.circuits)
    assert torch.equal(kept.scores, full.scores)  # the trunk was searched (and scored) too
    assert kept.meta["search_trunk"] is True


# ----- baselines, dispatch --------------------------------------------------------------------
def test_magnitude_reacts_to_zeroed_head() -> None:
    model = _model()
    before = score_heads(model, "magnitude").scores
    assert before.shape == (L, H) and (before > 0).all()
    dh = 32 // H
    attn = model.bert.encoder.layer[1].attention
    rows = slice(2 * dh, 3 * dh)
    with torch.no_grad():
        for lin in (attn.self.query, attn.self.key, attn.self.value):
            lin.weight[rows] = 0
        attn.output.dense.weight[:, rows] = 0
    after = score_heads(model, "magnitude").scores
    assert after[1, 2] == 0
    mask = torch.ones(L, H, dtype=torch.bool)
    mask[1, 2] = False
    assert torch.equal(after[mask], before[mask])


def test_random_is_seeded(model) -> None:
    a = score_heads(model, "random", seed=1).scores
    assert a.shape == (L, H)
    assert torch.equal(a, score_heads(model, "random", seed=1).scores)
    assert not torch.equal(a, score_heads(model, "random", seed=2).scores)


def test_unknown_method(model) -> None:
    with pytest.raises(ValueError, match="method.*" + ", ".join(METHODS)):
        score_heads(model, "fisher")


# ----- HeadScores -----------------------------------------------------------------------------
def test_head_scores_round_trip(tmp_path, circuit_run) -> None:
    hs, _ = circuit_run
    path = hs.save(tmp_path / "sub" / "scores.safetensors")
    assert sorted(p.name for p in path.parent.iterdir()) == ["scores.safetensors"]
    back = HeadScores.load(path)
    assert torch.equal(back.scores, hs.scores)
    assert back.method == "circuit"
    assert back.circuits == hs.circuits
    assert back.meta == hs.meta


def test_head_scores_validation_and_bad_files(tmp_path) -> None:
    with pytest.raises(ValueError, match="finite"):
        HeadScores(torch.tensor([[1.0, float("nan")]]), "taylor")
    with pytest.raises(ValueError, match="layers, heads"):
        HeadScores(torch.ones(3), "taylor")
    with pytest.raises(ValueError):
        HeadScores(torch.ones(2, 2), "circuit", circuits=[HeadPlan.from_layers([[0], [5]])])
    with pytest.raises(ValueError, match="JSON"):
        HeadScores(torch.ones(2, 2), "taylor", meta={"x": object()}).save(tmp_path / "a.st")
    other = tmp_path / "other.safetensors"
    save_file({"w": torch.ones(2)}, str(other))
    with pytest.raises(ValueError, match="HeadScores"):
        HeadScores.load(other)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="readable"):
        HeadScores.load(broken)


@pytest.mark.parametrize("family", FAMILIES)
def test_taylor_scores_a_silenced_head_zero_in_every_family(family) -> None:
    """A head whose output-projection columns are zero has no effect, so no Taylor importance;
    every other head of a random model has some."""
    model = tiny_model(family)
    adapter = get_adapter(model)
    dh = adapter.head_dim
    with torch.no_grad():
        adapter.out_proj(1).weight[:, 2 * dh : 3 * dh] = 0
    label_gen = torch.Generator().manual_seed(5)
    batches = []
    for seed in (31, 32):
        batch = tiny_inputs(family, 6, seed=seed)
        batch["labels"] = torch.randint(3, (6,), generator=label_gen)
        batches.append(batch)
    scores = score_heads(model, "taylor", train_batches=batches, progress=False).scores
    assert scores.shape == (3, 4) and torch.isfinite(scores).all()
    assert scores[1, 2] == 0
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1, 2] = False
    assert (scores[mask] > 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_circuit_prefix_replay_changes_nothing(family) -> None:
    """Replaying blocks 0..l-1 while scoring layer l gives the importances of full recomputes."""
    from tiny_models import tiny_inputs, tiny_model

    model = tiny_model(family)
    label_gen = torch.Generator().manual_seed(5)
    val = []
    for seed in (11, 12):  # two batches: the replay must keep them in order
        batch = tiny_inputs(family, 6, seed=seed)
        batch["labels"] = torch.randint(3, (6,), generator=label_gen)
        val.append(batch)
    ood = [tiny_inputs(family, 6, seed=13)]
    common = dict(val_batches=val, ood_val_batches=ood, num_circuits=2, heads_per_layer=2)
    adapter = get_adapter(model)
    first_layer_runs = []
    hook = adapter.out_proj(0).register_forward_pre_hook(lambda *_: first_layer_runs.append(1))
    replayed = score_heads(model, "circuit", progress=False, reuse_prefix=True, **common)
    replayed_runs = len(first_layer_runs)
    recomputed = score_heads(model, "circuit", progress=False, reuse_prefix=False, **common)
    hook.remove()
    assert replayed_runs < len(first_layer_runs) - replayed_runs  # layer 0 really was skipped
    assert replayed.circuits == recomputed.circuits
    torch.testing.assert_close(
        torch.tensor(replayed.meta["per_circuit_importance"]),
        torch.tensor(recomputed.meta["per_circuit_importance"]),
        rtol=0,
        atol=1e-6,
    )
    assert all("forward" not in vars(adapter.block(i)) for i in range(adapter.num_layers))


# ----- bit-identity with the scorers as they were before the package split ----------------------
REFERENCE = Path(__file__).parent / "data" / "scoring_reference.safetensors"
#: fixture metadata key: the CPU kind that wrote it (:func:`_cpu_kind`)
WRITTEN_ON = "__cpu_kind__"


def _cpu_kind() -> str:
    """torch's CPU capability and the CPU vendor (MKL and oneDNN pick kernels by both), e.g.
    ``AVX512 AuthenticAMD``: bit-identical floats are only expected on the same kind."""
    vendor = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    return f"{torch.backends.cpu.get_cpu_capability()} {vendor}"


@functools.cache
def _reference_model(family: str) -> torch.nn.Module:
    return tiny_model(family)  # scoring neither changes weights nor leaves the model in train mode


def _reference_data(family: str) -> tuple[list[dict], list[dict]]:
    """Two labelled batches of 6 (train / ID validation) and one unlabelled OOD batch."""
    label_gen = torch.Generator().manual_seed(5)
    labelled = []
    for seed in (21, 22):
        batch = tiny_inputs(family, 6, seed=seed)
        batch["labels"] = torch.randint(3, (6,), generator=label_gen)
        labelled.append(batch)
    return labelled, [tiny_inputs(family, 6, seed=23)]


def _reference_cases() -> dict[str, tuple[str, str, dict]]:
    """Case name -> (family, method, options): every method, several seeds and options."""
    cases: dict[str, tuple[str, str, dict]] = {}
    for family in ("bert", "hf_vit", "timm_vit"):  # the families the fixture was written for
        cases[f"{family}/taylor"] = (family, "taylor", {})
        cases[f"{family}/taylor/raw"] = (family, "taylor", {"normalize": False, "max_batches": 1})
        cases[f"{family}/magnitude"] = (family, "magnitude", {})
    for family, seed in (("bert", 0), ("bert", 1), ("hf_vit", 0), ("timm_vit", 1)):
        cases[f"{family}/circuit/seed{seed}"] = (family, "circuit", {"seed": seed})
    cases["bert/circuit/trunk"] = (
        "bert",
        "circuit",
        {"shared_layers": 1, "overlap_penalty": 0.25, "reuse_prefix": False, "objective": "avg"},
    )
    cases["bert/circuit/search_trunk"] = (
        "bert",
        "circuit",
        {
            "shared_layers": 1,
            "search_trunk": True,
            "bootstrap": False,
            "objective": ["ood", "nll"],
            "num_circuits": 3,
            "heads_per_layer": 1,
        },
    )
    for seed in (0, 1, 2):
        cases[f"bert/random/seed{seed}"] = ("bert", "random", {"seed": seed})
    return cases


def _reference_run(family: str, method: str, options: dict) -> HeadScores:
    model = _reference_model(family)
    labelled, ood = _reference_data(family)
    if method == "taylor":
        options = {"train_batches": labelled, "progress": False, **options}
    elif method == "circuit":
        options = {
            "val_batches": labelled,
            "ood_val_batches": ood,
            "num_circuits": 2,
            "heads_per_layer": 2,
            "progress": False,
            **options,
        }
    return score_heads(model, method, **options)


def _reference_record(hs: HeadScores) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors (scores [L, H]; circuit: per-circuit importances [M, L, H] float64) and the
    rest of the result as JSON-ready data (method, meta, circuits)."""
    meta = dict(hs.meta)
    tensors = {"scores": hs.scores}
    if "per_circuit_importance" in meta:
        per = meta.pop("per_circuit_importance")
        tensors["per_circuit"] = torch.tensor(per, dtype=torch.float64)
    circuits = None if hs.circuits is None else [p.to_dict() for p in hs.circuits]
    header = json.loads(json.dumps({"method": hs.method, "meta": meta, "circuits": circuits}))
    return tensors, header


@contextlib.contextmanager
def _one_thread():
    """CPU kernels split work by thread count, which moves the last bits: pin it to 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _write_reference() -> None:
    """Regenerate the fixture: only when a change of the scores is intended (say so in review)."""
    tensors, metadata = {}, {}
    for name, case in _reference_cases().items():
        with _one_thread():
            record, header = _reference_record(_reference_run(*case))
        tensors.update({f"{name}/{key}": value for key, value in record.items()})
        metadata[name] = json.dumps(header, allow_nan=False, separators=(",", ":"))
    metadata[WRITTEN_ON] = _cpu_kind()
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(REFERENCE), metadata=metadata)


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(REFERENCE), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()  # noqa: SIM118


def _assert_same_header(got: object, want: object, exact: bool, where: str = "header") -> None:
    """Equal, except that floats may differ by rounding when ``exact`` is False; every choice
    (circuits, heads, objectives, seeds) must still be the same."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_same_header(got[key], want[key], exact, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same_header(g, w, exact, f"{where}[{i}]")
    elif isinstance(want, float) and not exact:
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6), where
    else:
        assert got == want, where


@pytest.mark.parametrize("name", sorted(_reference_cases()))
def test_scores_are_bit_identical_to_the_single_module_scorers(name, reference) -> None:
    """Every method, seeds and options: the very tensors (and meta, circuits) of the scorers as
    they were before the split into a package (tests/lib/data, written by ``_write_reference``).

    Bit for bit on the CPU kind that wrote the fixture (:func:`_cpu_kind`, e.g. ``AVX512
    AuthenticAMD``). Another kind's kernels round differently (AVX2: up to 4.3e-7 absolute), so
    there the numbers must agree to 1e-6 and every selection exactly.
    """
    tensors, metadata = reference
    exact = metadata.get(WRITTEN_ON) == _cpu_kind()
    with _one_thread():
        record, header = _reference_record(_reference_run(*_reference_cases()[name]))
    stored = {key for key in tensors if key.rsplit("/", 1)[0] == name}
    assert stored == {f"{name}/{key}" for key in record}
    for key, value in record.items():
        expected = tensors[f"{name}/{key}"]
        assert value.dtype == expected.dtype, key
        if exact:
            assert torch.equal(value, expected), key
        else:
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6, msg=key)
    _assert_same_header(header, json.loads(metadata[name]), exact)


# ----- the registry ---------------------------------------------------------------------------
def test_registry_lists_the_four_criteria() -> None:
    assert METHODS == ("taylor", "circuit", "magnitude", "random")
    assert list(SCORERS)[:4] == list(METHODS)
    classes = (TaylorImportance, CircuitImportance, MagnitudeImportance, RandomImportance)
    assert [SCORERS[m] for m in METHODS] == list(classes)
    assert all(issubclass(cls, HeadImportance) and cls.name == m for m, cls in SCORERS.items())
    assert scorer_arguments("taylor") == (
        ("normalize", "max_batches", "progress"),
        ("train_batches",),
    )
    assert scorer_arguments("circuit").data == ("val_batches", "ood_val_batches")
    assert scorer_arguments("magnitude") == ((), ())
    assert scorer_arguments("random") == (("seed",), ())
    built = get_scorer("taylor", normalize=False)
    assert built == TaylorImportance(normalize=False) and built.options()["normalize"] is False


def test_get_scorer_rejects_unknown_names_and_options(model) -> None:
    with pytest.raises(ValueError, match=r"name='nope'.*taylor, circuit, magnitude, random"):
        get_scorer("nope")
    with pytest.raises(ValueError, match=r"'random' does not take normalize; allowed: seed$"):
        get_scorer("random", normalize=True)
    with pytest.raises(ValueError, match="'magnitude' does not take seed; allowed: nothing"):
        score_heads(model, "magnitude", seed=1)
    allowed = "train_batches, normalize, max_batches, progress"
    with pytest.raises(
        ValueError, match=f"'taylor' does not take seed, val_batches; allowed: {allowed}"
    ):
        score_heads(model, "taylor", seed=0, val_batches=[], train_batches=[_batch(4, 0)])


def test_criteria_objects_compute_what_the_functions_compute(model, val, ood) -> None:
    batches = [_batch(8, 3)]
    taylor = TaylorImportance(normalize=False, progress=False)(model, train_batches=batches)
    direct = taylor_scores(model, batches, normalize=False)
    assert torch.equal(taylor.scores, direct.scores) and taylor.meta == direct.meta
    options = dict(num_circuits=2, heads_per_layer=1, seed=3, progress=False)
    circuit = get_scorer("circuit", **options)(model, val_batches=val, ood_val_batches=ood)
    direct = circuit_scores(model, val, ood_val_batches=ood, **options)
    assert torch.equal(circuit.scores, direct.scores) and circuit.circuits == direct.circuits
    assert torch.equal(MagnitudeImportance()(model).scores, magnitude_scores(model).scores)
    assert torch.equal(RandomImportance(seed=4)(model).scores, random_scores(model, seed=4).scores)


@pytest.fixture
def registered_mine():
    """A user criterion ``mine``: layer index x its option ``scale``, counted over a batch list."""

    @register_scorer("mine")
    @dataclasses.dataclass(frozen=True)
    class LayerDepthImportance(HeadImportance):
        scale: float = 1.0

        def __call__(self, model, *, probe_batches=None) -> HeadScores:
            adapter = get_adapter(model)
            layers, heads = adapter.num_layers, adapter.num_heads(0)
            depth = torch.arange(layers, dtype=torch.float32)[:, None].expand(layers, heads)
            meta = {"batches": len(probe_batches or [])}
            return HeadScores(self.scale * depth, self.name, meta=meta)

    yield LayerDepthImportance
    SCORERS.unregister("mine")


def test_a_user_criterion_is_usable_through_score_heads(model, registered_mine) -> None:
    assert list(SCORERS) == [*METHODS, "mine"] and registered_mine.name == "mine"
    hs = score_heads(model, "mine", scale=2.0, probe_batches=[_batch(4, 0)] * 3)
    assert hs.method == "mine" and hs.meta == {"batches": 3}
    assert torch.equal(hs.scores[:, 0], torch.tensor([0.0, 2.0]))
    assert get_scorer("mine", scale=3.0) == registered_mine(scale=3.0)
    with pytest.raises(
        ValueError, match="'mine' does not take seed; allowed: probe_batches, scale"
    ):
        score_heads(model, "mine", seed=1)
    with pytest.raises(ValueError, match=r"method='fisher'.*random, mine"):
        score_heads(model, "fisher")
    with pytest.raises(ValueError, match="'mine' is already registered"):
        register_scorer("mine")(registered_mine)
    for not_a_criterion in (type("NoCall", (), {}), lambda model: None):
        with pytest.raises(ValueError, match="needs a class that defines __call__"):
            register_scorer("not_callable")(not_a_criterion)
    assert "not_callable" not in SCORERS


if __name__ == "__main__":
    _write_reference()
