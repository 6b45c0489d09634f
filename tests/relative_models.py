"""Tiny random-init models of the relative-position families (``mpnet``, ``deberta_v2``)."""

from __future__ import annotations

import copy

import torch
from tiny_models import NUM_CLASSES, NUM_HEADS, NUM_LAYERS, perturbed
from torch import nn
from transformers import (
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    MPNetConfig,
    MPNetForSequenceClassification,
)

from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads

#: family variants: MPNet; DeBERTa-v3's layout (log buckets, normed relative embeddings, no
#: absolute positions, no token types, position projections shared with q/k); a DeBERTa-v2-like
#: one (no buckets, absolute positions, token types, separate position projections).
VARIANTS = ("mpnet", "deberta_v3", "deberta_v2")
VOCAB = 60
LENGTH = 11


def tiny_relative_model(variant: str, seed: int = 0, **overrides) -> nn.Module:
    """A 3-layer, 4-head, hidden-32 model of ``variant`` in eval mode, weights O(0.1) and the
    relative-position parameters O(1) (so the position term changes the logits)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        intermediate_size=64,
        num_labels=NUM_CLASSES,
        max_position_embeddings=40,
    )
    if variant == "mpnet":
        config = MPNetConfig(**{**common, "relative_attention_num_buckets": 32, **overrides})
        model: nn.Module = MPNetForSequenceClassification(config)
        relative = model.mpnet.encoder.relative_attention_bias.weight
    else:
        v3 = variant == "deberta_v3"
        kwargs = dict(
            relative_attention=True,
            share_att_key=v3,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8 if v3 else -1,
            max_relative_positions=16 if v3 else 6,
            norm_rel_ebd="layer_norm" if v3 else "none",
            position_biased_input=not v3,
            type_vocab_size=0 if v3 else 2,
            pooler_hidden_act="gelu",
        )
        config = DebertaV2Config(**{**common, **kwargs, **overrides})
        model = DebertaV2ForSequenceClassification(config)
        relative = model.deberta.encoder.rel_embeddings.weight
    perturbed(model, seed + 1000, scale=0.1)
    with torch.no_grad():
        relative.normal_(0, 1, generator=torch.Generator().manual_seed(seed + 7))
    return model.eval()


def relative_inputs(variant: str, batch: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Ragged, end-padded text (the family's pad id in padding; none in the real tokens)."""
    pad = 1 if variant == "mpnet" else 0
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, LENGTH), generator=g)
    mask = torch.ones(batch, LENGTH, dtype=torch.long)
    for row in range(batch):
        length = 2 + (row * 4) % (LENGTH - 1)
        mask[row, length:] = 0
        ids[row, length:] = pad
    out = {"input_ids": ids, "attention_mask": mask}
    if variant == "deberta_v2":
        out["token_type_ids"] = (torch.arange(LENGTH) >= 3).long().expand(batch, -1).clone()
    return out


def relative_members(
    variant: str, plans: list[HeadPlan], fine_tuned: bool = True, seed: int = 0
) -> list[nn.Module]:
    """Members pruned to ``plans`` from one base, each nudged apart when ``fine_tuned``."""
    base = tiny_relative_model(variant, seed)
    members = [prune_heads(copy.deepcopy(base), plan) for plan in plans]
    if fine_tuned:
        members = [perturbed(m, 100 + i) for i, m in enumerate(members)]
    return members
