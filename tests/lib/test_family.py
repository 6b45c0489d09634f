"""hydra_ops.adapters.family: the one registry of model families, what each registration states,
and the one-line refusals."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from hydra_ops.adapters import (
    FAMILIES,
    default_family,
    family_of_model_type,
    model_types,
    register_family,
)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_registration_loads_classes_that_know_their_family(name):
    family = FAMILIES[name]
    adapter, stage = family.adapter_class(), family.embedding_stage_class()
    assert (adapter.family, adapter.modality, stage.family) == (name, family.modality, name)
    assert adapter.__module__.startswith("hydra_ops.adapters.")
    for model_type in family.model_types:  # each type it loads is one its adapter can build
        assert adapter.hf_class(model_type)[1].__name__ in family.classes


def test_the_text_families_and_their_model_types():
    assert model_types() == {
        "bert": "bert",
        "roberta": "roberta",
        "xlm-roberta": "roberta",
        "camembert": "roberta",
        "distilbert": "distilbert",
        "electra": "electra",
        "mpnet": "mpnet",
        "deberta-v2": "deberta_v2",
    }
    assert family_of_model_type("camembert", "x").name == "roberta"
    assert (default_family("text").name, default_family("image").name) == ("bert", "timm_vit")


def test_an_unknown_model_type_is_one_line_naming_the_known_ones():
    with pytest.raises(ValueError) as info:
        family_of_model_type("gpt2", "'f/config.json'")
    msg = str(info.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("'f/config.json' has model_type 'gpt2', not a supported one: bert (bert)")
    assert all(t in msg for t in model_types())


def test_a_taken_name_model_type_or_default_is_refused():
    bert = FAMILIES["bert"]
    with pytest.raises(ValueError, match="'bert' is already registered"):
        register_family(dataclasses.replace(bert, model_types=()))
    with pytest.raises(ValueError, match=r"model_type \['bert'\] is already registered to 'bert'"):
        register_family(dataclasses.replace(bert, name="bert2"))
    with pytest.raises(ValueError, match="text already has a default family: 'bert'"):
        register_family(dataclasses.replace(bert, name="bert2", model_types=()))
    with pytest.raises(ValueError, match="'auto' is reserved"):
        register_family(
            dataclasses.replace(bert, name="auto", model_types=(), default_for_modality=False)
        )
    assert "bert2" not in FAMILIES


def test_reading_the_registry_imports_no_torch_and_a_text_model_no_timm():
    light = (
        "import sys\n"
        "from hydra_ops.adapters import FAMILIES\n"
        "assert [f.lr for _, f in FAMILIES.items()]\n"
        "assert 'torch' not in sys.modules, 'torch'\n"
    )
    run = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text_only = (
        "import sys\n"
        "import torch\n"
        "from transformers import DistilBertConfig, DistilBertForSequenceClassification\n"
        "from hydra_ops.adapters import get_adapter\n"
        "m = DistilBertForSequenceClassification(DistilBertConfig(dim=32, n_heads=4, n_layers=1,"
        " hidden_dim=64, vocab_size=50))\n"
        "assert get_adapter(m).family == 'distilbert'\n"
        "assert 'timm' not in sys.modules, 'timm'\n"
    )
    run = subprocess.run([sys.executable, "-c", text_only], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
