"""tasks.params.overrides and files: refusals of their inputs, each one line naming the file or
key: non-UTF-8 params files, list indices in --set keys, unknown profiles."""

from __future__ import annotations

import pytest
import yaml

from tasks.params import (
    PROFILES,
    ConfigError,
    apply_sets,
    default_gates,
    load_params,
    read_yaml,
    resolve_params,
    set_dotted,
    to_raw,
    validate_params,
)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


# ---- B6: params files must be UTF-8 ----


def test_a_non_utf8_params_file_is_one_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(b"seed: 1\nprofile: caf\xe9\n")
    for read in (read_yaml, load_params):
        with pytest.raises(ConfigError) as info:
            read(path)
        assert one_line(info) == (
            f"{path}: not UTF-8 text (byte 0xe9 at offset 20); save it as UTF-8"
        )


# ---- B7: --set keys index lists ----


def test_set_indexes_the_gates():
    cfg = resolve_params("quick", sets={"gates.0.metric": "nll"})
    first = cfg.gates[0]
    assert (first.metric, first.split, first.baseline) == ("nll", "id_test", "single")
    assert first.greater_is_better is False and first.name == "id_test.nll vs single"
    assert len(cfg.gates) == len(default_gates())
    edited = apply_sets(to_raw(cfg), {"gates.4.tolerance": 0.05})  # an edited params.yaml
    assert edited.gates[0].metric == "nll" and edited.gates[4].tolerance == 0.05
    again = apply_sets(to_raw(edited), {"gates.0.metric": "accuracy"})
    assert again.gates[0].greater_is_better is True and again.gates[0].name.endswith(
        "accuracy vs single"
    )


def test_set_keeps_a_hand_set_gate_name():
    raw = {"gates": [{"metric": "accuracy", "threshold": 0.5, "name": "mine"}]}
    set_dotted(raw, "gates.0.threshold", 0.7)
    assert raw["gates"][0] == {"metric": "accuracy", "threshold": 0.7, "name": "mine"}


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (
            "gates.13.metric",
            "gates.13.metric: index 13 is past the end of gates (13 entries, allowed: 0..12)",
        ),
        ("gates.x.metric", "gates.x.metric: gates is a list, 'x' is not an index (allowed: 0..12)"),
        (
            "gates.-1.metric",
            "gates.-1.metric: gates is a list, '-1' is not an index (allowed: 0..12)",
        ),
        ("seed.x", "seed.x: 'seed' is not a section"),
    ],
)
def test_set_with_a_bad_index_is_one_line(key, words):
    with pytest.raises(ConfigError) as info:
        resolve_params("quick", sets={key: "auroc"} if key != "seed.x" else {"seed": 1, key: 2})
    assert one_line(info) == f"params: {words}"


# ---- B8: profile names ----


def test_an_unknown_profile_is_refused_everywhere():
    allowed = ", ".join(PROFILES)
    with pytest.raises(ConfigError) as info:
        apply_sets(to_raw(resolve_params("quick")), {"profile": "nope"})
    assert one_line(info) == f"params: profile: unknown profile 'nope'; allowed: {allowed}"
    with pytest.raises(ConfigError) as info:
        validate_params({"profile": "nope"})
    assert one_line(info) == f"params.yaml: profile: unknown profile 'nope'; allowed: {allowed}"
    for name in PROFILES:
        raw = yaml.safe_load(yaml.safe_dump(to_raw(resolve_params(name))))
        assert validate_params(raw).profile == name
