"""tasks.params.names: the built-in names params.yaml may hold are the library registries' own,
checked before a run (tasks.runtime.preflight), one line per unknown name naming its key."""

from __future__ import annotations

import pytest

from tasks.params.base import ConfigError
from tasks.params.core import PROFILE_NAMES
from tasks.params.names import REGISTRY_KEYS, allowed_names, check_names
from tasks.params.overrides import resolve_params
from tasks.params.profiles import PROFILES
from tasks.params.schema import PipelineConfig, validate_params
from tasks.runtime.preflight import resolve_run_params


def _default(key: str) -> object:
    *sections, leaf = key.split(".")
    model: type = PipelineConfig
    for part in sections:
        model = model.model_fields[part].annotation
    return model.model_fields[leaf].default


@pytest.mark.parametrize("key", list(REGISTRY_KEYS))
def test_every_default_name_is_in_its_registry(key):
    """check_names does not look a default up: each must be what the library holds."""
    default = _default(key)
    assert default is None or default in allowed_names(key), (key, default)


def test_registry_names_come_from_the_library():
    from hydra_ops.compile.backends import BACKEND_REGISTRY
    from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
    from hydra_ops.scoring import SCORERS

    assert set(allowed_names("scoring.method")) == set(SCORERS)
    assert set(allowed_names("merge.attention")) == set(ATTENTION_IMPLEMENTATIONS)
    assert set(allowed_names("compile.backend")) == {"auto", "eager", *BACKEND_REGISTRY}


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ({"scoring": {"method": "taylr"}}, "params: scoring.method: unknown scorer 'taylr'"),
        (
            {"merge": {"attention": "flash"}},
            "params: merge.attention: unknown attention implementation 'flash'",
        ),
        (
            {"compile": {"backend": "tvm"}},
            "params: compile.backend: unknown compile backend 'tvm'",
        ),
        ({"members": {"strategy": "best"}}, "params: members.strategy: unknown selection"),
        ({"model": {"family": "gpt2"}}, "params: model.family: unknown model family 'gpt2'"),
    ],
)
def test_an_unknown_name_is_one_line_naming_the_key_and_the_allowed(raw, line):
    with pytest.raises(ConfigError) as info:
        check_names(validate_params(raw))
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(line), msg
    key = line.split(": ")[1]
    assert msg.endswith("allowed: " + ", ".join(allowed_names(key))), msg


def test_known_names_other_than_the_defaults_pass():
    cfg = validate_params(
        {
            "scoring": {"method": "circuit"},
            "merge": {"attention": "member_gemm", "mode": "average"},
            "members": {"strategy": "topk"},
            "compile": {"backend": "inductor"},
        }
    )
    check_names(cfg)


def test_several_unknown_names_give_one_line_each():
    cfg = validate_params({"scoring": {"method": "x"}, "merge": {"attention": "y"}})
    with pytest.raises(ConfigError) as info:
        check_names(cfg)
    keys = [line.split(": ")[1] for line in str(info.value).splitlines()]
    assert keys == ["scoring.method", "merge.attention"]


def test_run_refuses_an_unknown_name_before_anything_is_written(tmp_path):
    from tasks.params.files import write_params

    write_params(resolve_params("quick"), tmp_path / "params.yaml")
    before = (tmp_path / "params.yaml").read_text()
    with pytest.raises(ConfigError, match=r"^params: scoring\.method: unknown scorer 'nope'"):
        resolve_run_params(tmp_path, None, None, ["scoring.method=nope"])
    assert (tmp_path / "params.yaml").read_text() == before


def test_profile_names_are_the_profiles():
    """The schema checks a file's ``profile`` against the names alone, so that no stage depends
    on the profiles' overrides (editing the quick profile reruns nothing)."""
    assert tuple(PROFILES) == PROFILE_NAMES
