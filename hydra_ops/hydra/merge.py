"""The merge: M pruned members of one architecture fused into one :class:`HydraEnsemble`.

:func:`merge_members` reads each member's canonical weights through its adapter, decides per
parameter whether it stays per member, writes the ``architecture`` description the network is
built from (see :mod:`hydra_ops.hydra.ensemble`) and copies the weights in.

Modes:

* ``stack``: norms, MLPs, embeddings and classifier stay per member, so the merged model IS the
  ensemble of the members (tested to 1e-5 in fp32). A parameter that is equal across all members
  (for example every MLP of members pruned from one base without fine-tuning) is stored once and run
  once per stream as a plain dense op: same result, no extra parameters.
* ``average``: those non-attention parameters are averaged across members (the paper's "merged MLP";
  no extra parameters). Attention is always per member.

The input embedding is computed once when the members' embeddings are equal, and always in
``average`` mode; otherwise each stream gets its own.

``shared_layers = k`` (a hydra: one neck, many heads): the first ``k`` layers are unpruned, run once
on ``[1, B, T, D]`` and the streams fork after them (an expanded view, no copy). In ``stack`` mode
the members must be identical in those layers; in ``average`` mode they are averaged.

The merged model is for inference: it has no dropout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from hydra_ops.adapters import (
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    LayerNormWeights,
    ModelAdapter,
    get_adapter,
)
from hydra_ops.heads.surgery import head_plan_of

from .ensemble import HydraBlock, HydraClassifier, HydraEnsemble
from .grouped import GroupedLayerNorm, GroupedLinear, attention_implementation

__all__ = [
    "MERGE_MODES",
    "HydraBlock",
    "HydraClassifier",
    "HydraEnsemble",
    "MergeMode",
    "merge_members",
]

MergeMode = Literal["stack", "average"]
MERGE_MODES = ("stack", "average")


# ----- architecture description ----------------------------------------------------------------
def _norm_arch(weights: Sequence[LayerNormWeights], per_member: bool) -> dict[str, Any]:
    return {
        "dim": int(weights[0].weight.shape[0]),
        "eps": weights[0].eps,
        "bias": weights[0].bias is not None,
        "per_member": per_member,
    }


# ----- merging -----------------------------------------------------------------------------------
def _all_equal(tensors: Sequence[Tensor | None]) -> bool:
    first = tensors[0]
    if first is None:
        return all(t is None for t in tensors)
    return all(
        t is not None and t.shape == first.shape and torch.equal(t, first) for t in tensors[1:]
    )


def _combine(tensors: Sequence[Tensor | None], per_member: bool) -> Tensor | None:
    """Per member: stack to ``[M, ...]``; shared: the mean (equal tensors average to themselves)."""
    if tensors[0] is None:
        return None
    stacked = torch.stack([t.detach() for t in tensors])
    return stacked if per_member else stacked.mean(dim=0)


def _copy_(param: nn.Parameter | None, value: Tensor | None) -> None:
    if param is None:
        return
    with torch.no_grad():
        param.copy_(value)


def _decide(mode: str, *groups: Sequence[Tensor | None]) -> bool:
    """Whether a module with these per-member tensors must stay per member."""
    return mode == "stack" and not all(_all_equal(g) for g in groups)


def _check_compatible(adapters: Sequence[ModelAdapter], stages: Sequence[EmbeddingStage]) -> None:
    first = adapters[0]

    def facts(a: ModelAdapter, stage: EmbeddingStage) -> dict[str, Any]:
        block = a.block_weights(0)
        return {
            "family": a.family,
            "num_layers": a.num_layers,
            "hidden_size": a.hidden_size,
            "head_dim": a.head_dim,
            "num_classes": a.num_classes,
            "mlp_hidden": int(block.mlp.fc1_weight.shape[0]),
            "activation": block.mlp.activation,
            "norm_first": block.norm_first,
            "positions": a.position_scores(),
            "embedding": stage.config(),
        }

    expected = facts(first, stages[0])
    for index, (adapter, stage) in enumerate(zip(adapters, stages, strict=True)):
        if index == 0:
            continue
        got = facts(adapter, stage)
        diffs = [k for k in expected if expected[k] != got[k]]
        if diffs:
            detail = ", ".join(
                f"{k}: member 0 has {expected[k]!r}, member {index} has {got[k]!r}"
                for k in diffs
                if k != "embedding"
            )
            if "embedding" in diffs:
                detail = (detail + ", " if detail else "") + "embedding configuration differs"
            raise ValueError(
                f"members: member {index} does not share member 0's base architecture ({detail})"
            )


def merge_members(
    members: Sequence[nn.Module],
    mode: MergeMode = "stack",
    attention: str = "padded_bmm",
    shared_layers: int = 0,
    class_names: Sequence[str] | None = None,
) -> HydraEnsemble:
    """Fuse pruned copies of one architecture into a :class:`HydraEnsemble`.

    Args:
        members: M >= 1 models of one supported family and base architecture, each possibly pruned
            (any head count >= 1 per layer) and fine-tuned separately.
        mode: ``"stack"`` (exact ensemble) or ``"average"`` (non-attention parameters averaged).
        attention: grouped attention implementation, a key of
            ``hydra_ops.hydra.grouped.ATTENTION_IMPLEMENTATIONS``.
        shared_layers: number of leading layers computed once and shared by all streams.
        class_names: optional label names stored with the model.

    Raises:
        ValueError: empty or mismatched members, unknown mode/implementation, bad shared_layers.
    """
    if isinstance(members, nn.Module) or not isinstance(members, Sequence) or not members:
        raise ValueError("members must be a non-empty list of models")
    if mode not in MERGE_MODES:
        raise ValueError(f"mode must be one of {list(MERGE_MODES)}, got {mode!r}")
    attention_implementation(attention)
    adapters = [get_adapter(model) for model in members]
    families = {a.family for a in adapters}
    if len(families) > 1:
        raise ValueError(f"members: all members must be of one family, got {sorted(families)}")
    stages = [a.embedding_stage() for a in adapters]
    _check_compatible(adapters, stages)
    first = adapters[0]
    num_layers = first.num_layers
    if not isinstance(shared_layers, int) or not 0 <= shared_layers < num_layers:
        raise ValueError(
            f"shared_layers must be an int in 0..{num_layers - 1}, got {shared_layers!r}"
        )
    m = len(members)
    stage_states = [s.state_dict() for s in stages]
    emb_per_member = mode == "stack" and not all(
        _all_equal([st[k] for st in stage_states]) for k in stage_states[0]
    )
    if emb_per_member and shared_layers:
        raise ValueError(
            "shared_layers > 0 needs one shared embedding, but the members' embeddings differ; "
            "use mode='average' or keep the embeddings frozen when fine-tuning members"
        )

    attn_weights = [
        [a.merge_attention_weights(layer) for a in adapters] for layer in range(num_layers)
    ]
    block_weights = [[a.block_weights(layer) for a in adapters] for layer in range(num_layers)]
    head_weights = [a.classifier_weights() for a in adapters]

    trunk_attn: list[AttentionWeights] = []
    for layer in range(shared_layers):
        ws = attn_weights[layer]
        counts = {w.num_heads for w in ws}
        if len(counts) != 1:
            raise ValueError(
                f"shared_layers={shared_layers}: layer {layer} has different head counts across "
                f"members ({sorted(counts)}); shared layers must be unpruned"
            )
        tensors = [
            [getattr(w, f) for w in ws]
            for f in (
                "q_weight",
                "q_bias",
                "k_weight",
                "k_bias",
                "v_weight",
                "v_bias",
                "o_weight",
                "o_bias",
            )
        ]
        shared_block = block_weights[layer]
        other = _block_tensor_groups(shared_block)
        if mode == "stack" and not all(_all_equal(g) for g in [*tensors, *other]):
            raise ValueError(
                f"shared_layers={shared_layers}: members differ in layer {layer}; in stack mode "
                "the shared layers must be identical (freeze them when fine-tuning) or use "
                "mode='average'"
            )
        positions = _position_groups(ws)
        if mode == "stack" and not all(_all_equal(g) for g in positions.values()):
            raise ValueError(
                f"shared_layers={shared_layers}: members differ in layer {layer}'s relative "
                "position weights; in stack mode the shared layers must be identical or use "
                "mode='average'"
            )
        combined = [_combine(g, per_member=False) for g in tensors]
        trunk_attn.append(
            AttentionWeights(
                *combined,
                num_heads=ws[0].num_heads,
                head_dim=ws[0].head_dim,
                position={k: _combine(g, per_member=False) for k, g in positions.items()}
                if ws[0].position is not None
                else None,
            )
        )

    def block_arch(layer: int, trunk: bool) -> dict[str, Any]:
        bws: list[BlockWeights] = block_weights[layer]
        mlps = [b.mlp for b in bws]
        per = (lambda *groups: False) if trunk else (lambda *groups: _decide(mode, *groups))
        return {
            "trunk": trunk,
            "norm_first": bws[0].norm_first,
            "attention": {
                "implementation": attention,
                "head_counts": [
                    w.num_heads
                    for w in (trunk_attn[layer : layer + 1] if trunk else attn_weights[layer])
                ],
            },
            "attn_norm": _norm_arch(
                [b.attn_norm for b in bws],
                per([b.attn_norm.weight for b in bws], [b.attn_norm.bias for b in bws]),
            ),
            "mlp_norm": _norm_arch(
                [b.mlp_norm for b in bws],
                per([b.mlp_norm.weight for b in bws], [b.mlp_norm.bias for b in bws]),
            ),
            "mlp": {
                "hidden": int(mlps[0].fc1_weight.shape[0]),
                "activation": mlps[0].activation,
                "bias": mlps[0].fc1_bias is not None,
                "fc1_per_member": per([x.fc1_weight for x in mlps], [x.fc1_bias for x in mlps]),
                "fc2_per_member": per([x.fc2_weight for x in mlps], [x.fc2_bias for x in mlps]),
            },
        }

    hw: list[ClassifierWeights] = head_weights

    def optional_norm_arch(norms: list[LayerNormWeights | None]) -> dict[str, Any] | None:
        if norms[0] is None:
            return None
        return _norm_arch(norms, _decide(mode, [n.weight for n in norms], [n.bias for n in norms]))

    head_arch = {
        "final_norm": optional_norm_arch([h.final_norm for h in hw]),
        "pool": hw[0].pool,
        "num_prefix_tokens": hw[0].num_prefix_tokens,
        "pre_classifier": None
        if hw[0].pre_classifier_weight is None
        else {
            "bias": hw[0].pre_classifier_bias is not None,
            "per_member": _decide(
                mode, [h.pre_classifier_weight for h in hw], [h.pre_classifier_bias for h in hw]
            ),
        },
        "pre_activation": hw[0].pre_activation,
        "fc_norm": optional_norm_arch([h.fc_norm for h in hw]),
        "classifier": {
            "bias": hw[0].classifier_bias is not None,
            "per_member": _decide(
                mode, [h.classifier_weight for h in hw], [h.classifier_bias for h in hw]
            ),
        },
    }
    architecture: dict[str, Any] = {
        "format": "hydra-ens/1",
        "family": first.family,
        "modality": first.modality,
        "mode": mode,
        "num_members": m,
        "hidden_size": first.hidden_size,
        "head_dim": first.head_dim,
        "num_classes": first.num_classes,
        "plans": [head_plan_of(model).to_dict() for model in members],
        "class_names": list(class_names) if class_names is not None else None,
        "embedding": {"config": stages[0].config(), "per_member": emb_per_member},
        "trunk": [block_arch(layer, True) for layer in range(shared_layers)],
        "blocks": [block_arch(layer, False) for layer in range(shared_layers, num_layers)],
        "head": head_arch,
        "base_architecture": first.architecture_config(),
    }
    positions_spec = first.position_scores()
    if positions_spec is not None:
        architecture["positions"] = positions_spec
    if emb_per_member:
        embeddings: nn.Module = nn.ModuleList(stages)
    else:
        embeddings = stages[0]
        averaged = {}
        for key in stage_states[0]:
            values = [st[key] for st in stage_states]
            averaged[key] = (
                torch.stack(values).mean(0) if values[0].is_floating_point() else values[0]
            )
        embeddings.load_state_dict(averaged)
    hydra = HydraEnsemble(architecture, embeddings)
    reference = next(iter(members[0].parameters()))
    hydra.to(dtype=reference.dtype, device=reference.device)

    for layer in range(num_layers):
        trunk = layer < shared_layers
        block = hydra.trunk[layer] if trunk else hydra.blocks[layer - shared_layers]
        layer_attn = trunk_attn[layer : layer + 1] if trunk else attn_weights[layer]
        block.attention.load_members(layer_attn)
        if block.attention.position is not None:
            block.attention.position.load_members(layer_attn)
        _load_block(block, block_weights[layer])
    _load_head(hydra.head, hw)
    return hydra.eval()


def _position_groups(ws: Sequence[AttentionWeights]) -> dict[str, list[Tensor]]:
    """Each ``AttentionWeights.position`` tensor across members, by name (empty without)."""
    if ws[0].position is None:
        return {}
    return {name: [w.position[name] for w in ws] for name in ws[0].position}


def _block_tensor_groups(bws: Sequence[BlockWeights]) -> list[list[Tensor | None]]:
    return [
        [b.attn_norm.weight for b in bws],
        [b.attn_norm.bias for b in bws],
        [b.mlp_norm.weight for b in bws],
        [b.mlp_norm.bias for b in bws],
        [b.mlp.fc1_weight for b in bws],
        [b.mlp.fc1_bias for b in bws],
        [b.mlp.fc2_weight for b in bws],
        [b.mlp.fc2_bias for b in bws],
    ]


def _load_linear(
    layer: GroupedLinear, weights: Sequence[Tensor], biases: Sequence[Tensor | None]
) -> None:
    _copy_(layer.weight, _combine(weights, layer.per_member))
    _copy_(layer.bias, _combine(biases, layer.per_member))


def _load_norm(norm: GroupedLayerNorm | None, weights: Sequence[LayerNormWeights | None]) -> None:
    if norm is None:
        return
    _copy_(norm.weight, _combine([w.weight for w in weights], norm.per_member))
    _copy_(norm.bias, _combine([w.bias for w in weights], norm.per_member))


def _load_block(block: HydraBlock, bws: Sequence[BlockWeights]) -> None:
    _load_norm(block.attn_norm, [b.attn_norm for b in bws])
    _load_norm(block.mlp_norm, [b.mlp_norm for b in bws])
    _load_linear(block.mlp.fc1, [b.mlp.fc1_weight for b in bws], [b.mlp.fc1_bias for b in bws])
    _load_linear(block.mlp.fc2, [b.mlp.fc2_weight for b in bws], [b.mlp.fc2_bias for b in bws])


def _load_head(head: HydraClassifier, hws: Sequence[ClassifierWeights]) -> None:
    _load_norm(head.final_norm, [h.final_norm for h in hws])
    _load_norm(head.fc_norm, [h.fc_norm for h in hws])
    if head.pre_classifier is not None:
        _load_linear(
            head.pre_classifier,
            [h.pre_classifier_weight for h in hws],
            [h.pre_classifier_bias for h in hws],
        )
    _load_linear(
        head.classifier, [h.classifier_weight for h in hws], [h.classifier_bias for h in hws]
    )
