"""The adapter protocol: what the rest of the library needs to know about a supported model.

An adapter wraps one model instance and answers, in family-neutral terms:

* its shape: ``num_layers``, ``hidden_size``, ``head_dim``, ``heads_per_layer()``;
* where the attention projections live (``out_proj(layer)`` is the ``nn.Linear`` that receives the
  concatenated head contexts, which is where per-head gates act), and how to read and replace one
  layer's attention weights (:class:`AttentionWeights`), which is all head surgery needs;
* canonical copies of every other weight the merge needs (:class:`BlockWeights`,
  :class:`ClassifierWeights`) and an :class:`EmbeddingStage` that maps raw inputs to the first
  hidden states;
* how to run the model on a batch (``logits(batch)``).

Families differ in naming and in fused projections (timm packs q/k/v into one ``qkv``); nothing
outside ``hydra_ops/adapters`` knows about those differences.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from .family import Modality, UnsupportedModelError

#: Activations the merged model can reproduce exactly, by canonical name.
ACTIVATIONS: dict[str, Any] = {
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "tanh": torch.tanh,
}


@dataclass
class AttentionWeights:
    """One layer's self-attention of one model, heads concatenated in head order.

    Shapes (``h`` heads of size ``dh``, hidden size ``D``): ``q_weight``, ``k_weight``,
    ``v_weight`` are ``[h * dh, D]`` with biases ``[h * dh]`` (or None); ``o_weight`` is
    ``[D, h * dh]`` with bias ``[D]`` (or None). Rows ``i * dh : (i + 1) * dh`` of q/k/v and the
    same columns of ``o_weight`` belong to head ``i``.

    ``position`` holds the family's per-head parts of its relative-position machinery (None when
    it has none), each tensor with one row per head (``[h, ...]``), selected with the heads: what
    the family's :class:`~hydra_ops.hydra.positions.PositionScores` reads (through
    ``merge_attention_weights``) or its adapter reinstalls (``set_attention_weights``).
    """

    q_weight: Tensor
    q_bias: Tensor | None
    k_weight: Tensor
    k_bias: Tensor | None
    v_weight: Tensor
    v_bias: Tensor | None
    o_weight: Tensor
    o_bias: Tensor | None
    num_heads: int
    head_dim: int
    position: dict[str, Tensor] | None = None

    @classmethod
    def from_linears(
        cls,
        q: nn.Linear,
        k: nn.Linear,
        v: nn.Linear,
        o: nn.Linear,
        num_heads: int,
        head_dim: int,
        position: dict[str, Tensor] | None = None,
    ) -> AttentionWeights:
        """Detached views of the four projections' weights and biases."""
        return cls(
            *(t for layer in (q, k, v, o) for t in (layer.weight.detach(), detached(layer.bias))),
            num_heads=num_heads,
            head_dim=head_dim,
            position=position,
        )

    def to_linears(
        self, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear
    ) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
        """New q, k, v, o layers holding copies of these weights, each like its template
        (device, dtype, training mode): what head surgery installs."""
        return (
            linear_from(self.q_weight, self.q_bias, q),
            linear_from(self.k_weight, self.k_bias, k),
            linear_from(self.v_weight, self.v_bias, v),
            linear_from(self.o_weight, self.o_bias, o),
        )

    def select_heads(self, heads: list[int] | tuple[int, ...]) -> AttentionWeights:
        """The weights of ``heads`` only (in the given order), as new tensors."""
        if not heads:
            raise ValueError("select_heads: heads is empty; a layer must keep at least one head")
        if min(heads) < 0 or max(heads) >= self.num_heads:
            raise ValueError(
                f"select_heads: head indices must be in 0..{self.num_heads - 1}, got {list(heads)}"
            )
        dh = self.head_dim
        rows = torch.cat([torch.arange(h * dh, (h + 1) * dh) for h in heads])

        def rows_of(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().index_select(0, rows.to(t.device)).clone()

        return AttentionWeights(
            q_weight=rows_of(self.q_weight),
            q_bias=rows_of(self.q_bias),
            k_weight=rows_of(self.k_weight),
            k_bias=rows_of(self.k_bias),
            v_weight=rows_of(self.v_weight),
            v_bias=rows_of(self.v_bias),
            o_weight=self.o_weight.detach().index_select(1, rows.to(self.o_weight.device)).clone(),
            o_bias=None if self.o_bias is None else self.o_bias.detach().clone(),
            num_heads=len(heads),
            head_dim=dh,
            position=None
            if self.position is None
            else {
                name: t.detach().index_select(0, torch.tensor(heads, device=t.device)).clone()
                for name, t in self.position.items()
            },
        )


@dataclass
class LayerNormWeights:
    """A LayerNorm over the last dimension: ``weight``/``bias`` ``[D]`` (bias may be None)."""

    weight: Tensor
    bias: Tensor | None
    eps: float


@dataclass
class MLPWeights:
    """``fc2(act(fc1(x)))``: ``fc1_weight [F, D]``, ``fc1_bias [F]``, ``fc2_weight [D, F]``,
    ``fc2_bias [D]``."""

    fc1_weight: Tensor
    fc1_bias: Tensor | None
    fc2_weight: Tensor
    fc2_bias: Tensor | None
    activation: str

    @classmethod
    def from_linears(cls, fc1: nn.Linear, fc2: nn.Linear, activation: str) -> MLPWeights:
        """Detached views of the two layers' weights and biases."""
        return cls(
            fc1.weight.detach(),
            detached(fc1.bias),
            fc2.weight.detach(),
            detached(fc2.bias),
            activation,
        )


@dataclass
class BlockWeights:
    """Everything of one transformer block except its attention.

    ``norm_first`` selects the residual layout:

    * pre-norm (ViT): ``x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))``
    * post-norm (BERT): ``x = attn_norm(x + attn(x)); x = mlp_norm(x + mlp(x))``
    """

    norm_first: bool
    attn_norm: LayerNormWeights
    mlp_norm: LayerNormWeights
    mlp: MLPWeights


@dataclass
class ClassifierWeights:
    """The classification head applied to the last hidden states ``[B, T, D]``.

    Order: ``final_norm`` on every token (None to skip); pool (``"cls"`` = token 0, ``"mean"`` =
    mean over tokens ``num_prefix_tokens:``); ``pre_classifier`` dense + ``pre_activation`` (the
    BERT pooler; None to skip); ``fc_norm`` (timm; None to skip); ``classifier`` dense ``[C, D]``.
    """

    final_norm: LayerNormWeights | None
    pool: Literal["cls", "mean"]
    num_prefix_tokens: int
    pre_classifier_weight: Tensor | None
    pre_classifier_bias: Tensor | None
    pre_activation: str | None
    fc_norm: LayerNormWeights | None
    classifier_weight: Tensor
    classifier_bias: Tensor | None


class EmbeddingStage(nn.Module, abc.ABC):
    """Maps raw inputs to the first hidden states ``[B, T, D]``.

    ``forward(inputs, attention_mask=None, token_type_ids=None)``: ``inputs`` is ``input_ids
    [B, T]`` for text and ``pixel_values [B, C, H, W]`` for images. ``config()`` returns a
    JSON-serialisable dict from which ``from_config`` rebuilds the same (untrained) module.
    """

    family: ClassVar[str]
    """Set from the family's registration (:meth:`ModelFamily.embedding_stage_class`)."""

    @abc.abstractmethod
    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor: ...

    @abc.abstractmethod
    def config(self) -> dict[str, Any]: ...

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Mapping[str, Any]) -> EmbeddingStage: ...

    def relative_embeddings(self) -> Tensor | None:
        """The relative-position embeddings every layer's attention reads, ``[P, D]`` (the
        family's :class:`~hydra_ops.hydra.positions.PositionScores` projects them), or None."""
        return None


class ModelAdapter(abc.ABC):
    """Family-specific knowledge about one model instance (see the module docstring)."""

    family: ClassVar[str]
    """Set from the family's registration (:meth:`ModelFamily.adapter_class`), as
    :attr:`modality` is."""
    modality: ClassVar[Modality]

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    @abc.abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """True if this adapter handles ``model``'s class."""

    # ----- shape -----------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def num_layers(self) -> int: ...

    @property
    @abc.abstractmethod
    def hidden_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def head_dim(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_classes(self) -> int: ...

    @abc.abstractmethod
    def num_heads(self, layer: int) -> int:
        """Current (possibly pruned) number of heads of ``layer``."""

    def heads_per_layer(self) -> list[int]:
        return [self.num_heads(layer) for layer in range(self.num_layers)]

    @abc.abstractmethod
    def block(self, layer: int) -> nn.Module:
        """Transformer block ``layer``: the module the model's layer loop calls once per forward."""

    @abc.abstractmethod
    def embedding_parameters(self) -> list[nn.Parameter]:
        """Every parameter used before block 0: token/patch and position embeddings, prefix tokens
        ([CLS], registers), embedding / pre-block norms. Each parameter once."""

    def trunk_parameters(self, num_layers: int) -> list[nn.Parameter]:
        """The parameters of a shared trunk of depth ``num_layers = k`` in ``0..L``: with ``k > 0``
        :meth:`embedding_parameters` plus blocks ``0..k-1``; ``k = 0`` is no trunk (empty list)."""
        if (
            isinstance(num_layers, bool)
            or not isinstance(num_layers, int)
            or not 0 <= num_layers <= self.num_layers
        ):
            raise ValueError(
                f"num_layers must be an int in 0..{self.num_layers} (the model's layers), "
                f"got {num_layers!r}"
            )
        if num_layers == 0:
            return []
        params = list(self.embedding_parameters())
        for layer in range(num_layers):
            params.extend(self.block(layer).parameters())
        return _unique(params)

    # ----- attention -------------------------------------------------------------------------
    @abc.abstractmethod
    def out_proj(self, layer: int) -> nn.Linear:
        """The output projection of ``layer``; its input is the head contexts ``[..., h * dh]``."""

    @abc.abstractmethod
    def attention_weights(self, layer: int) -> AttentionWeights:
        """Detached views of ``layer``'s attention weights (clone before editing)."""

    @abc.abstractmethod
    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        """Replace ``layer``'s projections by ``weights`` (any head count); update head counts."""

    def merge_attention_weights(self, layer: int) -> AttentionWeights:
        """The attention weights as the merge must use them (any output scaling folded in)."""
        return self.attention_weights(layer)

    # ----- the rest of the network -----------------------------------------------------------
    @abc.abstractmethod
    def block_weights(self, layer: int) -> BlockWeights: ...

    @abc.abstractmethod
    def classifier_weights(self) -> ClassifierWeights: ...

    @abc.abstractmethod
    def embedding_stage(self) -> EmbeddingStage:
        """A new :class:`EmbeddingStage` holding copies of the model's embedding weights."""

    def architecture_config(self) -> dict[str, Any]:
        """JSON-serialisable description of the base architecture (for provenance)."""
        return {}

    def position_scores(self) -> dict[str, Any] | None:
        """The family's relative-position attention term, ``{"kind": name, "config": {...}}``
        naming a :data:`hydra_ops.hydra.positions.POSITION_SCORES` entry (what the merged network
        adds to every layer's attention scores), or None when attention has no such term."""
        return None

    # ----- checkpoints (hydra_ops.models.checkpoints)
    # -----------------------------------------------
    @classmethod
    def model_config(cls, model: nn.Module) -> dict[str, Any]:
        """JSON-serialisable config of ``model``'s *unpruned* architecture, from which
        :meth:`build_model` rebuilds it (head counts as before any pruning)."""
        raise UnsupportedModelError(f"family {cls.family!r} cannot be saved as a checkpoint")

    @classmethod
    def build_model(cls, config: Mapping[str, Any]) -> nn.Module:
        """A new, untrained model from :meth:`model_config`'s output (never touches a hub)."""
        raise UnsupportedModelError(f"family {cls.family!r} cannot be loaded from a checkpoint")

    # ----- running -----------------------------------------------------------------------------
    @abc.abstractmethod
    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Run the model on a contract batch (docs/architecture.md); returns ``[B, classes]``."""


class HuggingFaceAdapter(ModelAdapter):
    """An adapter of ``transformers`` classifiers: :attr:`hf_classes` maps each ``model_type`` it
    handles to its ``(config class, model class)``; its checkpoint config is
    ``model.config.to_dict()``, rebuilt as ``model_class(config_class.from_dict(config))`` of the
    config's ``model_type``."""

    hf_classes: ClassVar[dict[str, tuple[Any, Any]]]
    #: Weight-name prefixes a pretrained encoder folder may lack: the new classification head
    #: (:func:`hydra_ops.models.factory.load_text_classifier`).
    new_weight_prefixes: ClassVar[tuple[str, ...]] = ("classifier.",)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        """True for an instance of exactly one of :attr:`hf_classes`' model classes: a subclass
        may compute something else (and may be a family of its own)."""
        return type(model) in {model_class for _, model_class in cls.hf_classes.values()}

    @classmethod
    def hf_class(cls, model_type: object) -> tuple[Any, Any]:
        """``(config class, model class)`` of ``model_type`` (UnsupportedModelError otherwise)."""
        if model_type not in cls.hf_classes:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not one of {cls.family!r}'s: "
                + ", ".join(cls.hf_classes)
            )
        return cls.hf_classes[model_type]  # type: ignore[index]

    @classmethod
    def model_config(cls, model: nn.Module) -> dict[str, Any]:
        return model.config.to_dict()

    @classmethod
    def build_model(cls, config: Mapping[str, Any]) -> nn.Module:
        config_class, model_class = cls.hf_class(config.get("model_type"))
        return model_class(config_class.from_dict(dict(config)))

    def architecture_config(self) -> dict[str, Any]:
        return self.model.config.to_dict()


def _unique(params: list[nn.Parameter]) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def linear_from(weight: Tensor, bias: Tensor | None, like: nn.Linear) -> nn.Linear:
    """A new ``nn.Linear`` with copies of ``weight [out, in]`` / ``bias`` on ``like``'s device."""
    out_features, in_features = weight.shape
    layer = torch.nn.utils.skip_init(
        nn.Linear,
        in_features,
        out_features,
        bias=bias is not None,
        device=like.weight.device,
        dtype=like.weight.dtype,
    )
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    layer.train(like.training)
    return layer


def layer_norm_weights(norm: nn.Module) -> LayerNormWeights:
    """Canonical weights of an ``nn.LayerNorm`` (raises for other norms)."""
    if not isinstance(norm, nn.LayerNorm):
        raise UnsupportedModelError(
            f"only nn.LayerNorm normalisation is supported, found {type(norm).__name__}"
        )
    if not norm.elementwise_affine:
        dim = norm.normalized_shape[-1]
        return LayerNormWeights(torch.ones(dim), torch.zeros(dim), float(norm.eps))
    bias = None if norm.bias is None else norm.bias.detach()
    return LayerNormWeights(norm.weight.detach(), bias, float(norm.eps))


def detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()
