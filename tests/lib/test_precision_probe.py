"""precision auto, measured: the decision rules (capability and timings passed in as small objects),
the probe on a real tiny model (it changes neither the model nor the random state, so a run where
auto keeps fp32 trains bit-identical weights) and the measurement cache."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_inputs, tiny_model

from hydra_ops.measurements import MeasurementCache, machine_key
from hydra_ops.models.training import fine_tune
from hydra_ops.perf.inference_probe import time_inference
from hydra_ops.perf.precision_probe import (
    Bf16Support,
    Timings,
    choose_precision,
    decide_inference_precision,
    decide_training_precision,
    time_training_steps,
)

NATIVE = Bf16Support(True, "CPU has avx512_bf16 (test)")
EMULATED = Bf16Support(False, "CPU has neither amx_bf16 nor avx512_bf16 (test)")
PASSED = {"passed": True, "max_abs_diff_probs": 3e-3, "argmax_agreement": 1.0}
FAILED = {"passed": False, "max_abs_diff_probs": 9e-2, "argmax_agreement": 0.97}


def timings(fp32: float, bf16: float) -> Timings:
    return Timings((fp32, fp32 * 1.01, fp32 * 0.99), (bf16, bf16 * 1.01, bf16 * 0.99))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def labelled(n: int = 4) -> dict[str, torch.Tensor]:
    return {**tiny_inputs("bert", n, seed=1), "labels": torch.arange(n) % 3}


def test_training_keeps_fp32_without_native_bf16_whatever_the_timings():
    choice = decide_training_precision(EMULATED, timings(1.0, 0.1))
    assert choice.precision == "fp32" and choice.source == "rule"
    assert "not native" in choice.reason and "avx512_bf16" in choice.reason


@pytest.mark.parametrize(
    ("fp32", "bf16", "expected", "words"),
    [
        (1.0, 1.0, "fp32", "not clearly faster"),  # not faster
        (1.0, 0.9, "fp32", "not clearly faster"),  # faster, but inside the 15% margin
        (1.0, 0.5, "bf16", "clearly faster"),
    ],
)
def test_training_takes_bf16_only_when_faster_by_the_margin(fp32, bf16, expected, words):
    choice = decide_training_precision(NATIVE, timings(fp32, bf16), margin=0.15)
    assert choice.precision == expected and choice.source == "measured"
    assert words in choice.reason
    assert choice.timings["speedup"] == pytest.approx(fp32 / bf16, rel=1e-3)
    assert choice.to_dict()["use"] == "training"


def test_rounds_that_overlap_keep_fp32_even_past_the_margin():
    # bf16's fastest step is 2x fp32's, but one bf16 step was slower than fp32's fastest
    overlapping = Timings(fp32=(1.0, 1.0, 1.0), bf16=(0.5, 0.5, 1.2))
    assert overlapping.speedup == pytest.approx(2.0)
    assert decide_training_precision(NATIVE, overlapping).precision == "fp32"
    apart = Timings(fp32=(1.0, 1.0, 1.0), bf16=(0.5, 0.5, 0.9))
    assert decide_training_precision(NATIVE, apart).precision == "bf16"


def test_two_measurements_within_noise_give_one_decision_and_one_reason():
    """What a stage output records (the decision) is the same for two timings of one choice."""
    for use in ("training", "inference"):
        choices = []
        for fp32, bf16 in ((1.0, 0.99), (1.0, 1.08), (1.0, 1.5)):  # noise, either way
            if use == "training":
                choices.append(decide_training_precision(NATIVE, timings(fp32, bf16)))
            else:
                choices.append(decide_inference_precision(NATIVE, timings(fp32, bf16), PASSED))
        assert {c.precision for c in choices} == {"fp32"}
        assert len({str(c.decision()) for c in choices}) == 1
        assert choices[0].timings != choices[1].timings  # the numbers go to the metrics


def test_inference_needs_agreement_and_speed():
    fast = timings(1.0, 0.5)
    assert decide_inference_precision(EMULATED, None, None).precision == "fp32"
    disagree = decide_inference_precision(NATIVE, fast, FAILED)
    assert disagree.precision == "fp32" and "disagrees" in disagree.reason
    assert disagree.check == FAILED
    slow = decide_inference_precision(NATIVE, timings(1.0, 0.95), PASSED)
    assert slow.precision == "fp32" and "agrees but" in slow.reason
    good = decide_inference_precision(NATIVE, fast, PASSED)
    assert good.precision == "bf16" and "agrees" in good.reason


def test_choose_measures_once_per_machine_and_shape_then_reuses(tmp_path):
    cache = MeasurementCache(tmp_path / "m.json")
    calls = []

    def measure():
        calls.append(1)
        return timings(1.0, 0.5), None

    kwargs = dict(support=NATIVE, cache=cache, measure=measure, batches=[labelled()])
    first = choose_precision("auto", "cpu", "training", **kwargs)
    again = choose_precision("auto", "cpu", "training", **kwargs)
    assert first.precision == again.precision == "bf16"
    assert (first.source, again.source) == ("measured", "cached") and len(calls) == 1
    # what a stage output records does not depend on whether the probe ran or was cached
    assert again.decision() == first.decision()
    # another shape is another measurement
    choose_precision("auto", "cpu", "training", **{**kwargs, "batches": [labelled(6)]})
    assert len(calls) == 2


def test_choose_does_not_measure_without_native_bf16_or_for_an_explicit_precision():
    def measure():
        raise AssertionError("must not measure")

    rule = choose_precision("auto", "cpu", "training", support=EMULATED, measure=measure)
    assert (rule.precision, rule.source) == ("fp32", "rule")
    pinned = choose_precision("fp32", "cpu", "inference", support=NATIVE, measure=measure)
    assert (pinned.precision, pinned.source) == ("fp32", "configured")
    asked = choose_precision("bf16", "cpu", "training", measure=measure)
    assert asked.precision == "bf16" and asked.source == "configured"
    with pytest.raises(ValueError, match="measure"):  # inference auto: the caller measures
        choose_precision(
            "auto",
            "cpu",
            "inference",
            support=NATIVE,
            model=tiny_model("bert"),
            batches=[labelled()],
        )


def test_probe_leaves_model_and_rng_alone_so_fp32_training_is_bit_identical():
    """A real probe on the real model, with a margin bf16 cannot reach: auto keeps fp32, and the
    model it then trains ends bit-identical to one trained with precision fp32 and no probe."""
    batch = labelled()
    probed, plain = tiny_model("bert", seed=0), tiny_model("bert", seed=0)
    before = {k: v.clone() for k, v in probed.state_dict().items()}
    state = torch.random.get_rng_state()
    choice = choose_precision(
        "auto",
        "cpu",
        "training",
        model=probed,
        batches=[batch],
        support=NATIVE,
        margin=1e9,
        steps=1,
    )
    assert choice.precision == "fp32" and choice.source == "measured"
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, before[k]) for k, v in probed.state_dict().items())
    assert all(p.grad is None for p in probed.parameters())

    def train(model, precision):
        fine_tune(
            model,
            lambda e: [batch, batch],
            epochs=1,
            seed=3,
            progress=False,
            log_fn=None,
            precision=precision,
        )
        return model.state_dict()

    a, b = train(probed, choice.precision), train(plain, "fp32")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_time_training_steps_keeps_frozen_parameters_frozen_and_times_both():
    model = tiny_model("bert")
    for p in model.bert.embeddings.parameters():
        p.requires_grad_(False)
    t = time_training_steps(model, labelled(), "cpu", steps=2)
    assert len(t.fp32) == len(t.bf16) == 2 and t.speedup > 0
    assert not any(p.requires_grad for p in model.bert.embeddings.parameters())
    with pytest.raises(ValueError, match="labels"):
        time_training_steps(model, tiny_inputs("bert", 2), "cpu")


def test_time_inference_checks_bf16_against_fp32():
    model = tiny_model("bert")
    t, check = time_inference(
        model,
        [tiny_inputs("bert", 3, seed=s) for s in (1, 2)],
        "cpu",
        tolerance=0.5,
        min_agreement=0.0,
        steps=1,
    )
    assert len(t.fp32) == 1 and check["passed"]
    assert 0 < check["max_abs_diff_probs"] < 0.5  # bf16 is not fp32
    _, strict = time_inference(
        model, [tiny_inputs("bert", 3)], "cpu", tolerance=1e-9, min_agreement=1.0, steps=1
    )
    assert not strict["passed"]


def test_measurement_cache_survives_corruption_and_separates_machines(tmp_path):
    path = tmp_path / "cache.json"
    cache = MeasurementCache(path)
    here = machine_key("cpu")
    assert here["device"] == "cpu" and here["torch"] == torch.__version__
    cache.put("k", {"a": 1}, here, {"v": 1})
    assert cache.get("k", {"a": 1}, here) == {"v": 1}
    assert cache.get("k", {"a": 1}, {**here, "cpu": "another CPU"}) is None
    assert cache.get("k", {"a": 2}, here) is None
    path.write_text("{not json")
    assert cache.get("k", {"a": 1}, here) is None  # a cache: unreadable means re-measure
    assert MeasurementCache(None).get("k", {}, here) is None


def test_speedup_compares_fastest_steps_so_one_busy_step_cannot_flip_the_choice() -> None:
    # bf16's true step is 2x faster; two of its three steps were slowed by load elsewhere
    timings = Timings(fp32=(1.0, 1.0, 1.1), bf16=(0.5, 3.0, 3.5))
    assert timings.speedup == pytest.approx(2.0)
    assert timings.to_dict()["bf16_best_ms"] == 500.0
    assert timings.to_dict()["bf16_median_ms"] == 3000.0
