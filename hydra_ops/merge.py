"""The merge: M pruned members of one architecture fused into one :class:`HydraEnsemble`.

Streams are laid out member-major, ``[M, B, T, D]``, from the embedding to the classifier, so every
per-member projection, MLP and norm reads the previous one's output as it is (no transposed copies).
Per layer, every member's q/k/v and output projections run as ONE grouped op (see
:mod:`hydra_ops.grouped`); attention never mixes members; one forward returns member logits
``[B, M, C]``.

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
import torch.nn.functional as F
from torch import Tensor, nn

from .adapters import (
    ACTIVATIONS,
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    LayerNormWeights,
    ModelAdapter,
    embedding_stage_from_config,
    get_adapter,
)
from .grouped import (
    GroupedAttention,
    GroupedLayerNorm,
    GroupedLinear,
    GroupedMLP,
    attention_implementation,
)
from .plans import HeadPlan
from .surgery import head_plan_of

MergeMode = Literal["stack", "average"]
MERGE_MODES = ("stack", "average")


class HydraBlock(nn.Module):
    """One transformer block over ``[M, B, T, D]`` streams (pre- or post-norm, see BlockWeights)."""

    def __init__(
        self,
        norm_first: bool,
        attention: GroupedAttention,
        attn_norm: GroupedLayerNorm,
        mlp: GroupedMLP,
        mlp_norm: GroupedLayerNorm,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attention = attention
        self.attn_norm = attn_norm
        self.mlp = mlp
        self.mlp_norm = mlp_norm

    def forward(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        if self.norm_first:
            x = x + self.attention(self.attn_norm(x), key_padding_mask)
            return x + self.mlp(self.mlp_norm(x))
        x = self.attn_norm(x + self.attention(x, key_padding_mask))
        return self.mlp_norm(x + self.mlp(x))


class HydraClassifier(nn.Module):
    """Classification head over ``[M, B, T, D]`` -> ``[M, B, C]`` (see ClassifierWeights)."""

    def __init__(
        self,
        final_norm: GroupedLayerNorm | None,
        pool: str,
        num_prefix_tokens: int,
        pre_classifier: GroupedLinear | None,
        pre_activation: str | None,
        fc_norm: GroupedLayerNorm | None,
        classifier: GroupedLinear,
    ) -> None:
        super().__init__()
        self.final_norm = final_norm
        self.pool = pool
        self.num_prefix_tokens = num_prefix_tokens
        self.pre_classifier = pre_classifier
        self.pre_activation = pre_activation
        self.fc_norm = fc_norm
        self.classifier = classifier

    def forward(self, x: Tensor) -> Tensor:
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = x[:, :, 0] if self.pool == "cls" else x[:, :, self.num_prefix_tokens :].mean(dim=2)
        if self.pre_classifier is not None:
            x = self.pre_classifier(x)
            if self.pre_activation is not None:
                x = ACTIVATIONS[self.pre_activation](x)
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return self.classifier(x)


class HydraEnsemble(nn.Module):
    """M pruned members fused into one network.

    ``forward(inputs, attention_mask=None, token_type_ids=None) -> member logits [B, M, C]``, where
    ``inputs`` is ``input_ids [B, T]`` (text) or ``pixel_values [B, C, H, W]`` (images) and
    ``attention_mask [B, T]`` marks real tokens with 1.

    Build it with :func:`merge_members`, or from a saved directory with
    :func:`hydra_ops.serialization.load_hydra`.
    """

    def __init__(self, architecture: dict[str, Any], embeddings: nn.Module | None = None) -> None:
        """Build the (untrained) network described by ``architecture``; ``embeddings``, when
        given, is used as the embedding stage(s) instead of building new ones."""
        super().__init__()
        self.architecture = architecture
        arch = architecture
        m = int(arch["num_members"])
        self.num_members = m
        self.family = arch["family"]
        self.modality = arch["modality"]
        self.mode = arch["mode"]
        self.plans = [HeadPlan.from_dict(p) for p in arch["plans"]]
        emb = arch["embedding"]
        if embeddings is not None:
            self.embeddings = embeddings
        elif emb["per_member"]:
            self.embeddings: nn.Module = nn.ModuleList(
                embedding_stage_from_config(self.family, emb["config"]) for _ in range(m)
            )
        else:
            self.embeddings = embedding_stage_from_config(self.family, emb["config"])
        self.trunk = nn.ModuleList(_block_from_arch(b, arch) for b in arch["trunk"])
        self.blocks = nn.ModuleList(_block_from_arch(b, arch) for b in arch["blocks"])
        self.head = _head_from_arch(arch["head"], arch)
        self.register_buffer("temperature", torch.ones(()), persistent=True)
        self.eval()

    # ----- properties ------------------------------------------------------------------------
    @property
    def shared_layers(self) -> int:
        return len(self.trunk)

    @property
    def attention_implementation(self) -> str:
        return self.blocks[0].attention.name

    @property
    def class_names(self) -> list[str] | None:
        return self.architecture.get("class_names")

    def num_parameters(self, effective: bool = True) -> int:
        """Parameter count; ``effective`` skips the zeros that attention padding or
        block-diagonal storage adds (what the members really hold)."""
        if not effective:
            return sum(p.numel() for p in self.parameters())
        total = 0
        for module in self.modules():
            if isinstance(module, GroupedAttention):
                total += module.num_effective_parameters()
            else:
                total += sum(p.numel() for p in module.parameters(recurse=False))
        return total

    def set_temperature(self, temperature: float) -> None:
        """Set the calibration temperature used by :meth:`predict_proba` (must be > 0)."""
        value = float(temperature)
        if not value > 0 or value != value:
            raise ValueError(f"temperature must be a positive number, got {temperature!r}")
        self.temperature.fill_(value)

    def set_attention_implementation(self, name: str) -> HydraEnsemble:
        """Switch every layer's grouped attention to implementation ``name`` (in place)."""
        attention_implementation(name)
        for block in [*self.trunk, *self.blocks]:
            block.attention = block.attention.to_implementation(name)
        for block_arch in [*self.architecture["trunk"], *self.architecture["blocks"]]:
            block_arch["attention"]["implementation"] = name
        return self

    # ----- forward -----------------------------------------------------------------------------
    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        mask = None if attention_mask is None else attention_mask.to(torch.bool)
        # streams [M, B, T, D] (member-major, see hydra_ops.grouped)
        if isinstance(self.embeddings, nn.ModuleList):
            x = torch.stack(
                [stage(inputs, attention_mask, token_type_ids) for stage in self.embeddings]
            )
        else:
            x = self.embeddings(inputs, attention_mask, token_type_ids).unsqueeze(0)
            for block in self.trunk:
                x = block(x, mask)
            x = x.expand(self.num_members, -1, -1, -1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x).transpose(0, 1).contiguous()

    @torch.no_grad()
    def predict_proba(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Ensemble probabilities ``[B, C]``: mean of member softmax, then the calibration
        temperature applied to its log (``softmax(log(mean_p) / T)``; identity at ``T = 1``)."""
        member_logits = self(inputs, attention_mask, token_type_ids)
        return ensemble_probabilities(member_logits, float(self.temperature))

    @torch.no_grad()
    def uncertainty(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Per-example uncertainty ``[B]`` tensors: ``total_entropy``, ``expected_entropy``,
        ``mutual_information``, ``disagreement`` (from the member softmaxes) and ``confidence``
        (max calibrated ensemble probability)."""
        from .uncertainty import decompose

        member_logits = self(inputs, attention_mask, token_type_ids)
        result = decompose(member_logits.softmax(dim=-1))
        result["confidence"] = ensemble_probabilities(member_logits, float(self.temperature)).amax(
            dim=-1
        )
        return result


def ensemble_probabilities(member_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``[B, M, C]`` member logits -> ``[B, C]``: ``softmax(log(mean_m softmax(z_m)) / T)``, the
    log of the mean from :func:`hydra_ops.calibration.ensemble_log_probs` (which validates it)."""
    from .calibration import ensemble_log_probs

    log_mean = ensemble_log_probs(member_logits)
    if temperature == 1.0:
        return log_mean.exp()
    return F.softmax(log_mean / temperature, dim=-1)


# ----- architecture description ----------------------------------------------------------------
def _norm_arch(weights: Sequence[LayerNormWeights], per_member: bool) -> dict[str, Any]:
    return {
        "dim": int(weights[0].weight.shape[0]),
        "eps": weights[0].eps,
        "bias": weights[0].bias is not None,
        "per_member": per_member,
    }


def _build_norm(arch: dict[str, Any] | None, m: int) -> GroupedLayerNorm | None:
    if arch is None:
        return None
    return GroupedLayerNorm(
        arch["dim"], arch["eps"], m if arch["per_member"] else None, arch["bias"]
    )


def _block_from_arch(block: dict[str, Any], arch: dict[str, Any]) -> HydraBlock:
    m = 1 if block["trunk"] else int(arch["num_members"])
    att = block["attention"]
    attention = attention_implementation(att["implementation"])(
        att["head_counts"], arch["head_dim"], arch["hidden_size"]
    )
    mlp_arch = block["mlp"]
    mlp = GroupedMLP(
        arch["hidden_size"],
        mlp_arch["hidden"],
        mlp_arch["activation"],
        m if mlp_arch["fc1_per_member"] else None,
        m if mlp_arch["fc2_per_member"] else None,
        mlp_arch["bias"],
    )
    return HydraBlock(
        block["norm_first"],
        attention,
        _build_norm(block["attn_norm"], m),
        mlp,
        _build_norm(block["mlp_norm"], m),
    )


def _head_from_arch(head: dict[str, Any], arch: dict[str, Any]) -> HydraClassifier:
    m = int(arch["num_members"])
    d = int(arch["hidden_size"])
    pre = None
    if head["pre_classifier"] is not None:
        p = head["pre_classifier"]
        pre = GroupedLinear(d, d, m if p["per_member"] else None, p["bias"])
    c = head["classifier"]
    classifier = GroupedLinear(
        d, int(arch["num_classes"]), m if c["per_member"] else None, c["bias"]
    )
    return HydraClassifier(
        _build_norm(head["final_norm"], m),
        head["pool"],
        int(head["num_prefix_tokens"]),
        pre,
        head["pre_activation"],
        _build_norm(head["fc_norm"], m),
        classifier,
    )


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
            ``hydra_ops.grouped.ATTENTION_IMPLEMENTATIONS``.
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
        combined = [_combine(g, per_member=False) for g in tensors]
        trunk_attn.append(
            AttentionWeights(*combined, num_heads=ws[0].num_heads, head_dim=ws[0].head_dim)
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
        block.attention.load_members(
            trunk_attn[layer : layer + 1] if trunk else attn_weights[layer]
        )
        _load_block(block, block_weights[layer])
    _load_head(hydra.head, hw)
    return hydra.eval()


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
