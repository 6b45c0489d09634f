"""The quick pipeline end to end on a user's checkpoint of a non-BERT family: a tiny random
RoBERTa saved with ``save_pretrained`` (and a word-level tokenizer built offline from the data)
as ``model.path``, a user's CSV as the data (``data.name: csv``). The family comes from the
folder's ``config.json``; every stage runs, the gate passes and the Hydra is promoted."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, make_project
from tasks.runtime.layout import STAGES
from tiny_models import save_text_folder

pytestmark = pytest.mark.slow

WORDS = {
    "sport": "match goal team score league coach player win",
    "music": "song band album guitar concert singer tune chart",
    "money": "bank shares market profit price trade stock fund",
    "weather": "rain storm cloud wind snow sunny cold forecast",
}
GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.0},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
    {"metric": "compile_max_abs_diff", "threshold": "compile_tolerance"},
]


def write_csv(path: Path, rows_per_class: int = 60) -> list[str]:
    rng = random.Random(0)
    rows = []
    for label, words in WORDS.items():
        vocab = words.split()
        for _ in range(rows_per_class):
            rows.append((" ".join(rng.choices(vocab, k=rng.randint(3, 9))), label))
    rng.shuffle(rows)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return [text for text, _ in rows]


def tiny_roberta(vocab_size: int):
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,  # quick max_length 32 + RoBERTa's offset
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
    )
    return RobertaForSequenceClassification(config)


def cli(*args: str) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ)
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


@pytest.fixture(scope="module")
def project(prefect_server, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("family")
    texts = write_csv(tmp / "topics.csv")
    save_text_folder(tiny_roberta(vocab_size=64), tmp / "roberta", texts)
    params = {
        "data": {
            "name": "csv",
            "path": str(tmp / "topics.csv"),
            "near_ood_classes": ["weather"],
            "max_per_split": 48,
            "far_ood_size": 48,
        },
        "model": {"path": str(tmp / "roberta")},
        "finetune": {"lr": 1e-3},
        "scoring": {"method": "circuit"},
        "gates": GATES,
        "baselines": {"mc_dropout": {"samples": 2}},
    }
    root = make_project(tmp / "proj", params)
    cli("run", "-C", str(root))
    return root


def test_a_roberta_checkpoint_runs_every_stage_to_a_release(project):
    from hydra_ops.models.checkpoints import read_checkpoint_metadata

    summary = json.loads((project / ".hydra-ens" / "last_run.json").read_text())
    assert summary["ran"] == list(STAGES)
    assert summary["gate"]["verdict"] == "passed"
    assert summary["promotion"]["promoted"] is True
    base = read_checkpoint_metadata(project / "models" / "base")
    assert base["family"] == "roberta" and base["config"]["model_type"] == "roberta"
    hydra = json.loads((project / "models" / "hydra" / "hydra.json").read_text())
    assert hydra["architecture"]["family"] == "roberta"
    rows = cli("predict", "-C", str(project), "--json", "goal team win", "song band")
    classes = {json.loads(line)["class"] for line in rows.stdout.strip().splitlines()}
    assert classes <= {"sport", "music", "money"}
