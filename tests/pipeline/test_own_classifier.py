"""A user's own fine-tuned classifier as the base, end to end: a tiny classifier is trained here on
a small CSV and saved as a Hugging Face folder; ``hydra-ens run --set model.path=...
--set finetune.from_checkpoint=true --set data.name=csv ...`` runs the pipeline without a base
fine-tune, to a verdict, and ``predict`` answers from the promoted model with the checkpoint's
label names (real DVC, GTO and an ephemeral Prefect server, as in test_pipeline_text.py).

The checkpoint's labels are in another order than the data's (sorted) classes, so the head's rows
are reordered on the way in. :data:`FACTORIES` builds the classifier of each family tested: one
entry per family, each a tiny random config of that family's ``*ForSequenceClassification``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from conftest import REPO, make_project

pytestmark = pytest.mark.slow

#: The checkpoint's label order (the data's classes, sorted, are account, refund, shipping).
LABELS = ["refund", "shipping", "account"]
NEAR_OOD = "weather"
WORDS = {
    "refund": "money back refund charge card paid returned price cost",
    "shipping": "parcel delivery courier tracking shipped box arrive late",
    "account": "password login email username locked reset profile sign",
    "weather": "rain sunny cloud storm wind forecast cold snow",
}


def tiny_roberta(labels: Sequence[str], vocab_size: int) -> torch.nn.Module:
    """A RoBERTa classifier over the project's WordPiece vocabulary (padding id 0, so RoBERTa's
    position ids, counted from the padding id, start at 1)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=72,  # max_length 64 + RoBERTa's offset
        pad_token_id=0,
        type_vocab_size=1,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(0)
    return RobertaForSequenceClassification(config)


#: family -> a tiny untrained ``*ForSequenceClassification`` with ``labels`` as its id2label: a
#: non-BERT family, so the run also shows the family taken from the folder's ``config.json``.
FACTORIES: dict[str, Callable[[Sequence[str], int], torch.nn.Module]] = {"roberta": tiny_roberta}


def write_csv(path: Path, per_class: int = 24) -> None:
    import csv
    import random

    rng = random.Random(0)
    rows = []
    for label, words in WORDS.items():
        vocab = words.split()
        for _ in range(per_class):
            rows.append({"text": " ".join(rng.choices(vocab, k=8)), "label": label})
    rng.shuffle(rows)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)


def train_classifier(family: str, folder: Path) -> None:
    """Fine-tune the family's tiny classifier on the ID classes and save it with its tokenizer,
    as a user's ``save_pretrained`` folder."""
    from hydra_ops.data.batching import text_tokenizer
    from hydra_ops.models.bundled import minilm_path

    tokenizer = text_tokenizer(str(minilm_path()))
    model = FACTORIES[family](LABELS, tokenizer.vocab_size)
    texts, targets = [], []
    for label in LABELS:
        for k in range(16):
            vocab = WORDS[label].split()
            texts.append(" ".join(vocab[(k + j) % len(vocab)] for j in range(6)))
            targets.append(LABELS.index(label))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    if "token_type_ids" in batch and family != "bert":
        del batch["token_type_ids"]
    y = torch.tensor(targets)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(**batch).logits, y)
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def cli(*args: str, code: int | None = 0) -> subprocess.CompletedProcess:
    """``hydra-ens ARGS`` as a real process against the session's Prefect server."""
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
        timeout=1200,
    )
    result.output = result.stdout + result.stderr
    if code is not None:
        assert result.returncode == code, result.output[-4000:]
    return result


#: Gates this tiny run can pass (it checks the path to a release, not the model's quality).
GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.0},
    {"metric": "auroc", "split": "near_ood", "baseline": "single", "tolerance": 1.0},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
    {"metric": "compile_max_abs_diff", "threshold": "compile_tolerance"},
]


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def project(request, prefect_server, tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp(f"own-{request.param}")
    checkpoint = base / "my-classifier"
    train_classifier(request.param, checkpoint)
    write_csv(base / "tickets.csv")
    params = {
        "scoring": {"method": "circuit"},
        "baselines": {"mc_dropout": {"enabled": False}},
        "gates": GATES,
        "runtime": {"precision": "fp32"},  # the path is under test, not the precision probe
    }
    root = make_project(base / "proj", params)
    cli(
        "run",
        "-C",
        str(root),
        "--set",
        "data.name=csv",
        "--set",
        f"data.path={base / 'tickets.csv'}",
        "--set",
        f"data.near_ood_classes=[{NEAR_OOD}]",
        "--set",
        f"model.path={checkpoint}",
        "--set",
        "finetune.from_checkpoint=true",
    )
    return root, checkpoint


def test_the_checkpoint_is_the_base_and_no_fine_tune_ran(project):
    root, checkpoint = project
    record = json.loads((root / "metrics" / "finetune_base.json").read_text())
    assert "train" not in record  # adopted, not trained
    assert record["from_checkpoint"]["sha256"]["config.json"]
    assert record["classes"] == sorted(LABELS)
    # the family comes from the folder's config.json, through to the merged model
    from hydra_ops.models.checkpoints import read_checkpoint_metadata

    family = read_checkpoint_metadata(root / "models" / "base")["family"]
    hydra = json.loads((root / "models" / "hydra" / "hydra.json").read_text())
    assert family == hydra["architecture"]["family"] == next(iter(FACTORIES))
    # the base's head rows follow the data's class order: same logits as the checkpoint's,
    # columns permuted
    from transformers import AutoModelForSequenceClassification

    from hydra_ops.data.batching import text_tokenizer
    from hydra_ops.models.checkpoints import load_model

    ours = load_model(root / "models" / "base").eval()
    theirs = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()
    tokenizer = text_tokenizer(str(checkpoint))
    batch = tokenizer(["parcel late", "reset my password"], return_tensors="pt", padding=True)
    with torch.no_grad():
        a, b = ours(**batch).logits, theirs(**batch).logits
    order = [LABELS.index(c) for c in sorted(LABELS)]
    torch.testing.assert_close(a, b[:, order], atol=1e-5, rtol=0)


def test_the_run_ends_with_a_verdict_without_a_deep_ensemble(project):
    root, _ = project
    summary = json.loads((root / ".hydra-ens" / "last_run.json").read_text())
    ev = json.loads((root / "metrics" / "evaluate.json").read_text())
    assert "deep_ensemble" not in ev["models"] and {"hydra", "single"} <= set(ev["models"])
    gate = json.loads((root / "reports" / "gate.json").read_text())
    assert gate["verdict"] == summary["gate"]["verdict"] == "passed"
    assert gate["baselines_used"] == ["single"]
    assert [c["against"] for c in gate["checks"]] == ["threshold", "single", *["threshold"] * 2]
    assert summary["promotion"]["promoted"] is True


def test_predict_answers_with_the_checkpoint_label_names(project):
    from hydra_ops.hydra.serialization import load_hydra

    root, _ = project
    # the promoted model carries the checkpoint's label names, in the data's order
    assert list(load_hydra(root / "models" / "bundle" / "model").class_names) == sorted(LABELS)
    res = cli("predict", "-C", str(root), "--json", "where is my parcel delivery", "reset password")
    rows = [json.loads(line) for line in res.output.strip().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["class"] in LABELS and 0 < row["prob"] <= 1
