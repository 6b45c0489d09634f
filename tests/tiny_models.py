"""Tiny random-init models of every supported family, for fast exactness tests."""

from __future__ import annotations

import copy

import timm
import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)

from hydra_ops.adapters import FAMILIES as REGISTERED
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads

FAMILIES = ("bert", "roberta", "distilbert", "electra", "hf_vit", "timm_vit")
TEXT_FAMILIES = tuple(f for f in FAMILIES if REGISTERED[f].modality == "text")
#: The padding token id of each text family's tiny config (RoBERTa's is 1: its positions start at
#: ``pad + 1``, so padded rows must carry it for the positions to be the model's own).
PAD_IDS = {"bert": 0, "roberta": 1, "distilbert": 0, "electra": 0}
NUM_LAYERS = 3
NUM_HEADS = 4
NUM_CLASSES = 3


def tiny_model(family: str, seed: int = 0, **overrides) -> nn.Module:
    """A 3-layer, 4-head, hidden-32 model of ``family`` in eval mode."""
    torch.manual_seed(seed)
    bert_like = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        intermediate_size=64,
        num_labels=NUM_CLASSES,
        max_position_embeddings=32,
    )
    if family == "bert":
        model = BertForSequenceClassification(BertConfig(**{**bert_like, **overrides}))
    elif family == "roberta":
        kwargs = dict(bert_like, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
        model = RobertaForSequenceClassification(RobertaConfig(**{**kwargs, **overrides}))
    elif family == "electra":
        # embedding_size < hidden_size: the model has an embeddings_project
        kwargs = dict(bert_like, embedding_size=16)
        model = ElectraForSequenceClassification(ElectraConfig(**{**kwargs, **overrides}))
    elif family == "distilbert":
        kwargs = dict(
            vocab_size=100,
            dim=32,
            n_layers=NUM_LAYERS,
            n_heads=NUM_HEADS,
            hidden_dim=64,
            num_labels=NUM_CLASSES,
            max_position_embeddings=32,
        )
        config = DistilBertConfig(**{**kwargs, **overrides})
        model = DistilBertForSequenceClassification(config)
    elif family == "hf_vit":
        kwargs = dict(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=NUM_LAYERS,
            num_attention_heads=NUM_HEADS,
            intermediate_size=64,
            num_labels=NUM_CLASSES,
        )
        config = ViTConfig(**{**kwargs, **overrides})
        model = ViTForImageClassification(config)
    elif family == "timm_vit":
        kwargs = dict(
            img_size=16,
            patch_size=4,
            embed_dim=32,
            depth=NUM_LAYERS,
            num_heads=NUM_HEADS,
            num_classes=NUM_CLASSES,
            init_values=0.5,
        )
        kwargs.update(overrides)
        model = timm.models.vision_transformer.VisionTransformer(**kwargs)
    else:
        raise KeyError(family)
    # Library inits (std 0.02) give near-constant logits; O(1) weights make exactness tests bite.
    return perturbed(model, seed + 1000, scale=0.1).eval()


def tiny_inputs(
    family: str, batch: int, seed: int = 1, padded: bool = True
) -> dict[str, torch.Tensor]:
    """A contract batch for ``family``; text batches get ragged padding when ``padded``."""
    g = torch.Generator().manual_seed(seed)
    if family in PAD_IDS:
        pad = PAD_IDS[family]
        ids = torch.randint(pad + 1, 100, (batch, 9), generator=g)
        mask = torch.ones(batch, 9, dtype=torch.long)
        if padded:
            for row in range(batch):
                length = 2 + (row * 3) % 8
                mask[row, length:] = 0
                ids[row, length:] = pad
        return {"input_ids": ids, "attention_mask": mask}
    return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}


def positional(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The HydraEnsemble positional arguments for a contract batch."""
    if "input_ids" in batch:
        return (batch["input_ids"], batch["attention_mask"])
    return (batch["pixel_values"],)


def perturbed(model: nn.Module, seed: int, scale: float = 0.05) -> nn.Module:
    """``model`` with every parameter nudged by seeded noise (a stand-in for member fine-tuning)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def member_plans(num_members: int, unequal: bool = True) -> list[HeadPlan]:
    """Distinct plans over 3 layers of 4 heads; with ``unequal`` the head counts differ."""
    plans = []
    for m in range(num_members):
        layers = []
        for layer in range(NUM_LAYERS):
            count = 1 + (m + layer) % NUM_HEADS if unequal else 2
            start = (m + 2 * layer) % NUM_HEADS
            layers.append(tuple(sorted({(start + i) % NUM_HEADS for i in range(count)})))
        plans.append(HeadPlan(tuple(layers)))
    return plans


def make_members(
    family: str, plans: list[HeadPlan], fine_tuned: bool, seed: int = 0, **overrides
) -> list[nn.Module]:
    base = tiny_model(family, seed, **overrides)
    members = [prune_heads(copy.deepcopy(base), plan) for plan in plans]
    if fine_tuned:
        members = [perturbed(m, 100 + i) for i, m in enumerate(members)]
    return members


def train_one_epoch(model: nn.Module, batches: list[dict], **kwargs) -> object:
    """One quiet epoch of :func:`hydra_ops.models.training.fine_tune` over ``batches`` at lr 1e-3
    (``kwargs`` go to it); its TrainReport. ``model`` is trained in place."""
    from hydra_ops.models.training import fine_tune

    return fine_tune(
        model, lambda _e: batches, epochs=1, lr=1e-3, progress=False, log_fn=None, **kwargs
    )


def save_text_folder(
    model: nn.Module, folder, texts: list[str] | tuple[str, ...] = ("a b c", "d e f")
) -> None:
    """Save ``model`` with ``save_pretrained`` and a word-level tokenizer built offline from
    ``texts`` (whitespace words, ``[UNK]``, the model's padding id kept) into ``folder``: a local
    model folder ``model.path`` and :func:`hydra_ops.models.factory.load_text_classifier` read."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pad_id = int(model.config.pad_token_id or 0)
    special = ["[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    special.insert(pad_id, "[PAD]")
    words = sorted({w for t in texts for w in t.lower().split()})
    vocab_size = int(model.config.vocab_size)
    vocab = {tok: i for i, tok in enumerate((special + words)[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
