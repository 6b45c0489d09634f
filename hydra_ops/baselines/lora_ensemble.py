"""LoRA-Ensemble (Mühlematter et al., "LoRA-Ensemble: Efficient Uncertainty Modelling for
Self-Attention Networks", 2024) on a fine-tuned classifier, with ``peft``.

``M`` LoRA adapters (Hu et al., 2021) on one frozen base: member ``i`` adds ``B_i A_i`` (rank
``r``, scaled by ``alpha / r``) to every attention projection (query, key, value and output;
timm's fused ``qkv`` and ``proj``) and has its own copy of the classifier (``peft``'s
``modules_to_save``), which starts as the base's. ``A_i`` is drawn with seed ``seed + i``
(``B_i`` starts at 0, so every member starts as the base), and each member is trained on its own
(:meth:`LoRAEnsemble.train_member`).

Two ways to run the members, the same numbers (``tests/lib/test_efficient_baselines.py``, 1e-5):

- *looped*: member by member, ``peft``'s active adapter switched between ``M`` forward passes;
- *batched*: one forward pass over the member-major copy of the batch
  (:mod:`hydra_ops.baselines.batching`), each row routed to its member's adapter by ``peft``'s
  mixed-adapter batches (``adapter_names``, one per row). ``benchmarks/efficient_baselines.py``
  measures which is faster; on 2 CPU cores member by member was (MiniLM-L6) or tied with
  (a small ViT) the batched pass, so it is the default.

The LoRA layers are those of ``peft`` (its ``LoraLayer`` and ``ModulesToSaveWrapper``); the per-row
adapter names reach them as the ``adapter_names`` keyword their ``forward`` takes, by forward
pre-hooks (what ``PeftModel.forward(..., adapter_names=...)`` does), so the base keeps its own
class and is run through its family adapter (:func:`hydra_ops.models.training.model_logits`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hydra_ops.baselines.batching import count_parameters, member_logits, repeat_batch
from hydra_ops.baselines.config import copy_state_into, write_config
from hydra_ops.baselines.config import read_config as _read_config

__all__ = [
    "LoRAEnsemble",
    "attention_targets",
    "classifier_name",
    "load_lora_ensemble",
    "save_lora_ensemble",
]

CONFIG_FILE = "lora_ensemble.json"
WEIGHTS_FILE = "adapters.safetensors"
FORMAT = "hydra-ens/lora-ensemble/1"


def _block_names(model: nn.Module) -> list[str]:
    from hydra_ops.adapters import get_adapter

    adapter = get_adapter(model)
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(adapter.block(i))] for i in range(adapter.num_layers)]


def attention_targets(model: nn.Module) -> list[str]:
    """Qualified names of every attention projection of ``model`` (a supported family): the
    ``nn.Linear`` modules of each block whose path inside the block names its attention (``attn``
    / ``attention``: BERT's and HF ViT's query, key, value and output dense, timm's ``qkv`` and
    ``proj``). ValueError when a block's output projection (the family adapter's ``out_proj``)
    is not among them."""
    from hydra_ops.adapters import get_adapter

    adapter = get_adapter(model)
    names = {id(m): n for n, m in model.named_modules()}
    targets = []
    for layer, block_name in enumerate(_block_names(model)):
        block = adapter.block(layer)
        found = [
            f"{block_name}.{n}"
            for n, m in block.named_modules()
            if isinstance(m, nn.Linear) and ("attn" in n or "attention" in n)
        ]
        if names[id(adapter.out_proj(layer))] not in found:
            raise ValueError(
                f"layer {layer}: found attention projections {found} without its output"
            )
        targets += found
    return targets


def classifier_name(model: nn.Module) -> str:
    """Qualified name of ``model``'s classifier: its one ``nn.Linear`` outside the blocks with
    as many outputs as classes (ValueError when there is not exactly one)."""
    from hydra_ops.adapters import get_adapter

    classes = get_adapter(model).num_classes
    blocks = tuple(f"{b}." for b in _block_names(model))
    found = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.out_features == classes and not n.startswith(blocks)
    ]
    if len(found) != 1:
        raise ValueError(f"expected one classifier layer with {classes} outputs, found {found}")
    return found[0]


@contextlib.contextmanager
def _adapter_per_row(model: nn.Module, names: Sequence[str]) -> Iterator[None]:
    """Inside the ``with``, every ``peft`` LoRA layer and saved-module wrapper of ``model`` runs
    each row of its input with the adapter ``names[row]`` (``peft``'s mixed-adapter batches)."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, "adapter_names": list(names)}

    handles = [
        m.register_forward_pre_hook(hook, with_kwargs=True)
        for m in model.modules()
        if isinstance(m, LoraLayer | ModulesToSaveWrapper)
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class LoRAEnsemble(nn.Module):
    """``num_members`` LoRA adapters and classifiers on one frozen classifier ``base``.

    ``base`` gets the adapters in place (``peft.get_peft_model``) and keeps its class, so its
    family adapter still runs it. Member ``i`` is ``peft`` adapter ``member_<i>``.
    ``batched`` picks how :meth:`forward` runs the members (module docstring; default: member by
    member); both give the same logits.

    Shape:
        - Input: a contract batch (``input_ids`` / ``attention_mask`` [B, T] or
          ``pixel_values`` [B, C, H, W]).
        - Output: member logits ``[B, M, classes]``.
    """

    def __init__(
        self,
        base: nn.Module,
        num_members: int,
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        seed: int = 0,
        batched: bool = False,
    ) -> None:
        super().__init__()
        from peft import LoraConfig, get_peft_model

        from hydra_ops.hashing import state_dict_sha256

        if num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {num_members}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base_sha256 = state_dict_sha256(base)
        self.num_members, self.rank, self.alpha = int(num_members), int(rank), float(alpha)
        self.dropout, self.seed, self.batched = float(dropout), int(seed), bool(batched)
        self.targets, self.classifier = attention_targets(base), classifier_name(base)
        config = LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.targets,
            modules_to_save=[self.classifier],
        )
        peft_model = None
        for i, name in enumerate(self.member_names):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + i)  # peft draws A_i from torch's global RNG
                if peft_model is None:
                    peft_model = get_peft_model(base, config, adapter_name=name)
                else:
                    peft_model.add_adapter(name, config)
        self.peft = peft_model
        self._member_params = {name: self._params_of(name) for name in self.member_names}
        for p in self.peft.parameters():
            p.requires_grad_(False)

    @property
    def member_names(self) -> list[str]:
        return [f"member_{i}" for i in range(self.num_members)]

    @property
    def model(self) -> nn.Module:
        """The base with the adapters in it (its own class)."""
        return self.peft.get_base_model()

    def _params_of(self, member: str) -> dict[str, nn.Parameter]:
        """Member ``member``'s own parameters (its LoRA factors and classifier copy) by name."""
        tag = f".{member}."
        return {
            n: p
            for n, p in self.model.named_parameters()
            if tag in n and ("lora_" in n or "modules_to_save" in n)
        }

    def member_parameters(self, member: int) -> list[nn.Parameter]:
        return list(self._member_params[self.member_names[member]].values())

    def train_member(self, member: int) -> nn.Module:
        """Make member ``member`` the active adapter and the only trainable parameters; returns
        the model to train (e.g. with :func:`hydra_ops.models.training.fine_tune`)."""
        self.peft.set_adapter(self.member_names[member])
        for p in self.peft.parameters():
            p.requires_grad_(False)
        for p in self.member_parameters(member):
            p.requires_grad_(True)
        return self.model

    def num_parameters(self) -> int:
        """Parameters the members use: the base once (without the classifier the members replace)
        plus every member's LoRA factors and classifier."""
        from peft.utils import ModulesToSaveWrapper

        original = [
            p
            for m in self.model.modules()
            if isinstance(m, ModulesToSaveWrapper)
            for p in m.original_module.parameters()
        ]
        return count_parameters(self.peft.parameters()) - count_parameters(original)

    def looped_logits(self, batch: Mapping[str, Any]) -> Tensor:
        """``[B, M, C]``: one forward pass per member, its adapter active."""
        from hydra_ops.models.training import model_logits

        out = []
        for name in self.member_names:
            self.peft.set_adapter(name, inference_mode=True)  # no requires_grad side effect
            out.append(model_logits(self.model, batch))
        return torch.stack(out, dim=1)

    def batched_logits(self, batch: Mapping[str, Any]) -> Tensor:
        """``[B, M, C]``: one forward pass over the member-major ``[M * B, ...]`` batch."""
        from hydra_ops.models.training import model_logits

        size = next(v for v in batch.values() if isinstance(v, Tensor)).shape[0]
        names = [name for name in self.member_names for _ in range(size)]
        with _adapter_per_row(self.model, names):
            logits = model_logits(self.model, repeat_batch(batch, self.num_members))
        return member_logits(logits, self.num_members)

    def forward(self, batch: Mapping[str, Any]) -> Tensor:
        return self.batched_logits(batch) if self.batched else self.looped_logits(batch)

    def adapter_state(self) -> dict[str, Tensor]:
        """Every member's parameters by qualified name (detached)."""
        return {n: p.detach() for params in self._member_params.values() for n, p in params.items()}

    def load_adapter_state(self, state: Mapping[str, Tensor]) -> None:
        """Copy ``state`` (as :meth:`adapter_state` gives it) in; ValueError naming the first
        missing, unexpected or misshapen key."""
        copy_state_into(self.adapter_state(), state, "adapters")


def save_lora_ensemble(
    ensemble: LoRAEnsemble, directory: Any, metadata: Mapping[str, Any] | None = None
) -> None:
    """Write the members' adapters and classifiers (safetensors) and ``lora_ensemble.json`` into
    the existing folder ``directory`` (the caller makes the write atomic). The base is not
    written: loading needs it and checks its hash."""
    from safetensors.torch import save_file

    out = Path(directory)
    state = {k: v.cpu().contiguous() for k, v in ensemble.adapter_state().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "format": FORMAT,
        "num_members": ensemble.num_members,
        "rank": ensemble.rank,
        "alpha": ensemble.alpha,
        "dropout": ensemble.dropout,
        "seed": ensemble.seed,
        "targets": ensemble.targets,
        "classifier": ensemble.classifier,
        "base_sha256": ensemble.base_sha256,
        "metadata": dict(metadata or {}),
    }
    write_config(out, CONFIG_FILE, config)


def read_config(directory: Any) -> dict[str, Any]:
    """The parsed ``lora_ensemble.json`` of ``directory`` (ValueError when missing or not one)."""
    return _read_config(directory, CONFIG_FILE, FORMAT, "LoRA-Ensemble")


def load_lora_ensemble(directory: Any, base: nn.Module, batched: bool = False) -> LoRAEnsemble:
    """The LoRA-Ensemble saved in ``directory`` on ``base`` (adapters injected in place), in eval
    mode. ValueError when ``base`` is not the model it was trained on (state-dict SHA-256)."""
    from safetensors.torch import load_file

    c = read_config(directory)
    ensemble = LoRAEnsemble(
        base, c["num_members"], c["rank"], c["alpha"], c["dropout"], c["seed"], batched
    )
    if ensemble.base_sha256 != c["base_sha256"]:
        raise ValueError(
            f"{directory}: trained on base {c['base_sha256'][:12]}, given "
            f"{ensemble.base_sha256[:12]}; retrain it on this base"
        )
    ensemble.load_adapter_state(load_file(str(Path(directory) / WEIGHTS_FILE)))
    return ensemble.eval()
