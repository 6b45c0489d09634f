"""BatchEnsemble (Wen, Tran & Ba, "BatchEnsemble: an Alternative Approach to Efficient Ensemble
and Lifelong Learning", ICLR 2020) on a fine-tuned classifier.

Every ``nn.Linear`` of the model (``W [out, in]``, bias ``b``) becomes a
:class:`BatchEnsembleLinear`: member ``i`` computes ``y = ((x * r_i) @ W.T) * s_i + b_i`` with
``W`` shared and the *fast weights* ``r_i [in]``, ``s_i [out]``, ``b_i [out]`` its own, i.e.
the rank-1 weight ``W * (s_i r_i^T)``. Embeddings, patch convolutions and norms stay shared.
The members run as one forward pass over a member-major batch
(:mod:`hydra_ops.baselines.batching`): ``M`` times the activations of the base, one copy of its
weights plus ``M * (in + 2 * out)`` numbers per linear layer.

On a fine-tuned base (this project's use): ``W`` and every ``b_i`` start as the base's, ``r_i``
and ``s_i`` are drawn from ``N(1, init_std)`` (seeded), and only the fast weights train; the
shared weights stay the fine-tuned base's, as LoRA-Ensemble's backbone does. With
``init_std = 0`` every member is the base exactly.

The layer's parametrisation and names follow torch-uncertainty's ``BatchLinear``
(``r_group``, ``s_group``, a per-member ``bias [M, out]``, the shared ``linear`` without bias;
``tests/lib/test_efficient_baselines.py`` checks the two agree numerically). It is not used
itself because: it takes ``[N, in]`` inputs only (a transformer's are ``[N, T, in]``); its
``from_linear`` makes a new random layer of the same shape instead of carrying the weights over;
and ``import torch_uncertainty.layers`` runs the package's ``__init__``, which imports Lightning
(a development-only dependency here, and seconds of import in every stage process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from hydra_ops.baselines.batching import count_parameters, member_logits, repeat_batch
from hydra_ops.baselines.config import copy_state_into, write_config
from hydra_ops.baselines.config import read_config as _read_config

__all__ = [
    "BatchEnsemble",
    "BatchEnsembleLinear",
    "load_batch_ensemble",
    "save_batch_ensemble",
]

#: The fast weights of one :class:`BatchEnsembleLinear`, by parameter name.
FAST_WEIGHTS = ("r_group", "s_group", "bias")
CONFIG_FILE = "batch_ensemble.json"
WEIGHTS_FILE = "fast_weights.safetensors"
FORMAT = "hydra-ens/batch-ensemble/1"


class BatchEnsembleLinear(nn.Module):
    """A linear layer shared by ``num_members`` members, each with rank-1 fast weights.

    Shape:
        - Input: ``[M * B, *, in_features]``, member-major (rows ``m * B : (m + 1) * B`` are
          member ``m``'s); any middle dimensions (tokens) pass through.
        - Output: ``[M * B, *, out_features]``.

    Parameters: ``linear.weight [out, in]`` (shared), ``r_group [M, in]``, ``s_group [M, out]``
    and ``bias [M, out]`` (or None). ValueError when the batch is not a multiple of ``M``.
    """

    def __init__(
        self, in_features: int, out_features: int, num_members: int, bias: bool = True
    ) -> None:
        super().__init__()
        if num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {num_members}")
        self.in_features, self.out_features = in_features, out_features
        self.num_members = num_members
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.r_group = nn.Parameter(torch.ones(num_members, in_features))
        self.s_group = nn.Parameter(torch.ones(num_members, out_features))
        self.bias = nn.Parameter(torch.zeros(num_members, out_features)) if bias else None

    @property
    def weight(self) -> Tensor:
        """The shared weight ``[out, in]`` (what code that reads ``nn.Linear.weight`` expects)."""
        return self.linear.weight

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        num_members: int,
        init_std: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> BatchEnsembleLinear:
        """``linear``'s weight shared, its bias copied to every member, ``r`` and ``s`` drawn
        from ``N(1, init_std)`` with ``generator``; on ``linear``'s device and dtype."""
        if init_std < 0:
            raise ValueError(f"init_std must be >= 0, got {init_std}")
        layer = cls(linear.in_features, linear.out_features, num_members, linear.bias is not None)
        with torch.no_grad():
            for p, size in (
                (layer.r_group, linear.in_features),
                (layer.s_group, linear.out_features),
            ):
                noise = torch.randn(num_members, size, generator=generator) * init_std
                p.copy_(1.0 + noise)
            layer.linear.weight.copy_(linear.weight)
            if layer.bias is not None:
                layer.bias.copy_(linear.bias.detach().expand(num_members, -1))
        return layer.to(device=linear.weight.device, dtype=linear.weight.dtype)

    def forward(self, x: Tensor) -> Tensor:
        m = self.num_members
        if x.shape[0] % m:
            raise ValueError(
                f"BatchEnsembleLinear: batch of {x.shape[0]} rows is not member-major for "
                f"{m} members (repeat the batch with hydra_ops.baselines.batching.repeat_batch)"
            )
        grouped = x.reshape(m, -1, self.in_features)  # [M, B * T, in]: member-major rows
        out = self.linear(grouped * self.r_group[:, None, :]) * self.s_group[:, None, :]
        if self.bias is not None:
            out = out + self.bias[:, None, :]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"num_members={self.num_members}, bias={self.bias is not None}"
        )


class BatchEnsemble(nn.Module):
    """A fine-tuned classifier of a supported family as an ``M``-member BatchEnsemble.

    ``base`` is converted in place (every ``nn.Linear`` -> :class:`BatchEnsembleLinear`) and kept
    as ``self.model``; only the fast weights require grad. ``forward(batch)`` runs the members as
    one pass over the member-major copy of ``batch``.

    Shape:
        - Input: a contract batch (``input_ids`` / ``attention_mask`` [B, T] or
          ``pixel_values`` [B, C, H, W]).
        - Output: member logits ``[B, M, classes]``.
    """

    def __init__(
        self, base: nn.Module, num_members: int, init_std: float = 0.1, seed: int = 0
    ) -> None:
        super().__init__()
        from hydra_ops.hashing import state_dict_sha256

        if num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {num_members}")
        self.base_sha256 = state_dict_sha256(base)
        self.num_members, self.init_std, self.seed = int(num_members), float(init_std), int(seed)
        generator = torch.Generator().manual_seed(self.seed)
        linears = [(n, m) for n, m in base.named_modules() if type(m) is nn.Linear]
        if not linears:
            raise ValueError(
                f"{type(base).__name__} has no nn.Linear layer to make a BatchEnsemble"
            )
        for p in base.parameters():
            p.requires_grad_(False)
        for name, linear in linears:
            parent_name, _, child = name.rpartition(".")
            parent = base.get_submodule(parent_name) if parent_name else base
            layer = BatchEnsembleLinear.from_linear(linear, self.num_members, init_std, generator)
            setattr(parent, child, layer)
            layer.linear.weight.requires_grad_(False)
        self.model = base

    def layers(self) -> dict[str, BatchEnsembleLinear]:
        """The converted layers by their name in ``self.model``."""
        return {n: m for n, m in self.model.named_modules() if isinstance(m, BatchEnsembleLinear)}

    def fast_weights(self) -> dict[str, Tensor]:
        """``{"<layer>.r_group" | ".s_group" | ".bias": tensor}``: what the members add to the
        base (detached, on the model's device)."""
        out = {}
        for name, layer in self.layers().items():
            for key in FAST_WEIGHTS:
                t = getattr(layer, key)
                if t is not None:
                    out[f"{name}.{key}"] = t.detach()
        return out

    def load_fast_weights(self, state: Mapping[str, Tensor]) -> None:
        """Copy ``state`` (as :meth:`fast_weights` gives it) in; ValueError naming the first
        missing, unexpected or misshapen key."""
        copy_state_into(self.fast_weights(), state, "fast weights")

    def num_parameters(self) -> int:
        """Parameters the ensemble holds: the base's once, plus every member's fast weights."""
        return count_parameters(self.model.parameters())

    def forward(self, batch: Mapping[str, Any]) -> Tensor:
        from hydra_ops.models.training import model_logits

        logits = model_logits(self.model, repeat_batch(batch, self.num_members))
        return member_logits(logits, self.num_members)


def save_batch_ensemble(
    ensemble: BatchEnsemble, directory: Any, metadata: Mapping[str, Any] | None = None
) -> None:
    """Write the fast weights (safetensors) and ``batch_ensemble.json`` into the existing folder
    ``directory`` (the caller makes the write atomic). The base itself is not written: loading
    needs it and checks its hash."""
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(directory)
    state = {k: v.cpu().contiguous() for k, v in ensemble.fast_weights().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "format": FORMAT,
        "num_members": ensemble.num_members,
        "init_std": ensemble.init_std,
        "seed": ensemble.seed,
        "base_sha256": ensemble.base_sha256,
        "metadata": dict(metadata or {}),
    }
    write_config(out, CONFIG_FILE, config)


def read_config(directory: Any) -> dict[str, Any]:
    """The parsed ``batch_ensemble.json`` of ``directory`` (ValueError when missing or not one)."""
    return _read_config(directory, CONFIG_FILE, FORMAT, "BatchEnsemble")


def load_batch_ensemble(directory: Any, base: nn.Module) -> BatchEnsemble:
    """The BatchEnsemble saved in ``directory`` on ``base`` (converted in place), in eval mode.
    ValueError when ``base`` is not the model it was trained on (state-dict SHA-256)."""
    from pathlib import Path

    from safetensors.torch import load_file

    config = read_config(directory)
    ensemble = BatchEnsemble(base, config["num_members"], config["init_std"], config["seed"])
    if ensemble.base_sha256 != config["base_sha256"]:
        raise ValueError(
            f"{directory}: trained on base {config['base_sha256'][:12]}, given "
            f"{ensemble.base_sha256[:12]}; retrain it on this base"
        )
    ensemble.load_fast_weights(load_file(str(Path(directory) / WEIGHTS_FILE)))
    return ensemble.eval()
