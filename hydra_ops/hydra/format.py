"""What a saved ``hydra.json`` must hold: the format's names and :func:`check_hydra_config`.

``hydra.json`` describes the model whose tensors ``model.safetensors`` stores (see
:mod:`hydra_ops.hydra.serialization`). Before anything is built from it, it must be consistent with
itself (members vs plans vs per-layer head counts, known family / mode / attention implementation,
``class_names`` vs ``num_classes``, nothing per member in ``average`` mode) and with the weights
(``dtype``, the ``temperature`` buffer bit for bit, the classifier's class count, exactly the tensor
names and shapes the architecture describes). A violation is one :class:`HydraFormatError` line:
``<source>: <field>: found <...>, expected <...>``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from hydra_ops.adapters import FAMILIES
from hydra_ops.messages import one_line

from .ensemble import HydraEnsemble
from .grouped import ATTENTION_IMPLEMENTATIONS
from .merge import MERGE_MODES

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "hydra.json"
FORMAT = "hydra-ens/1"
TEMPERATURE_KEY = "temperature"
CLASSIFIER_WEIGHT_KEY = "head.classifier.weight"
_MAX_SHOWN = 160


class HydraFormatError(ValueError):
    """A saved Hydra directory is missing, truncated, tampered with, inconsistent or of an unknown
    format. The message is one line naming the file (and, for an inconsistency, the field)."""


def check_hydra_config(
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    source: str | os.PathLike[str] = CONFIG_FILE,
) -> None:
    """Raise ``HydraFormatError`` unless ``config`` (a parsed ``hydra.json``) is consistent with
    itself and with ``state`` (the tensors of ``model.safetensors``).

    Checked: members vs plans; every plan's layer count vs trunk + blocks, its head indices vs the
    layer's head count (``hidden_size / head_dim``) and its per-layer head counts vs each block's
    recorded ``head_counts``; family, modality, mode and attention implementation names;
    ``class_names`` and the classifier weight's shape vs ``num_classes``; ``temperature`` equal
    (bit for bit) to the weights' temperature buffer; ``dtype`` vs the weights' floating tensors;
    the tensor names and shapes the architecture describes vs those in the weights. The message is
    one line: ``<source>: <field>: found <...>, expected <...>``.
    """
    check = _Checker(str(source))
    arch = check.mapping(config, "architecture", "")
    _check_architecture(check, arch)
    _check_against_weights(check, config, state)
    _check_tensor_layout(check, config, state)


def _shown(value: Any) -> str:
    """A value read from a file, as one short line."""
    text = one_line(repr(value))
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


class _Checker:
    """Raises one-line ``HydraFormatError``s about fields of one ``hydra.json``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, found: str, expected: str) -> NoReturn:
        raise HydraFormatError(
            f"{self.source}: {field}: found {one_line(found)}, expected {one_line(expected)}"
        )

    def get(self, mapping: Mapping[str, Any], key: str, field: str) -> Any:
        if key not in mapping:
            self.fail(f"{field}.{key}" if field else key, "nothing (field missing)", "a value")
        return mapping[key]

    def mapping(self, mapping: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
        value = self.get(mapping, key, field)
        name = f"{field}.{key}" if field else key
        if not isinstance(value, Mapping):
            self.fail(name, _shown(value), "a JSON object")
        return value

    def items(self, mapping: Mapping[str, Any], key: str, field: str) -> list[Any]:
        value = self.get(mapping, key, field)
        if not isinstance(value, list):
            self.fail(f"{field}.{key}" if field else key, _shown(value), "a JSON list")
        return value

    def integer(self, value: Any, field: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(field, _shown(value), f"an integer >= {minimum}")
        return value

    def choice(self, value: Any, field: str, allowed: Sequence[str]) -> str:
        if value not in allowed:
            self.fail(field, _shown(value), f"one of {sorted(allowed)}")
        return value


def _plan_layers(check: _Checker, plan: Any, field: str) -> list[list[int]]:
    """A plan's ``{"0": [heads], ...}`` as a list indexed by layer (keys 0..L-1, none missing)."""
    if not isinstance(plan, Mapping) or not plan:
        check.fail(field, _shown(plan), 'a non-empty JSON object {"0": [heads], ...}')
    keys = sorted(plan, key=lambda k: (len(k), k))
    if keys != [str(i) for i in range(len(keys))]:
        check.fail(f"{field} layers", _shown(keys), f"'0'..'{len(keys) - 1}' with none missing")
    layers = []
    for key in keys:
        heads = plan[key]
        name = f"{field}[{key!r}]"
        if not isinstance(heads, list) or not heads:
            check.fail(name, _shown(heads), "a non-empty list of head indices")
        for head in heads:
            check.integer(head, name, 0)
        if len(set(heads)) != len(heads):
            check.fail(name, _shown(heads), "each head listed once")
        layers.append(heads)
    return layers


def _check_architecture(check: _Checker, arch: Mapping[str, Any]) -> None:
    """Checks of ``hydra.json``'s ``architecture`` against itself."""
    a = "architecture"
    if arch.get("format", FORMAT) != FORMAT:
        check.fail(f"{a}.format", _shown(arch["format"]), repr(FORMAT))
    family = check.choice(check.get(arch, "family", a), f"{a}.family", list(FAMILIES))
    modality = FAMILIES[family].modality
    if check.get(arch, "modality", a) != modality:
        check.fail(f"{a}.modality", _shown(arch["modality"]), f"{modality!r} (family {family!r})")
    mode = check.choice(check.get(arch, "mode", a), f"{a}.mode", MERGE_MODES)
    num_members = check.integer(check.get(arch, "num_members", a), f"{a}.num_members", 1)
    hidden = check.integer(check.get(arch, "hidden_size", a), f"{a}.hidden_size", 1)
    head_dim = check.integer(check.get(arch, "head_dim", a), f"{a}.head_dim", 1)
    if hidden % head_dim:
        check.fail(f"{a}.head_dim", repr(head_dim), f"a divisor of hidden_size {hidden}")
    # Every supported family has hidden_size = heads * head_dim in every unpruned layer.
    layer_heads = hidden // head_dim
    num_classes = check.integer(check.get(arch, "num_classes", a), f"{a}.num_classes", 1)
    class_names = arch.get("class_names")
    if class_names is not None:
        if not isinstance(class_names, list) or not all(isinstance(n, str) for n in class_names):
            check.fail(f"{a}.class_names", _shown(class_names), "null or a list of strings")
        if len(class_names) != num_classes:
            check.fail(
                f"{a}.class_names",
                f"{len(class_names)} names",
                f"{num_classes} (architecture.num_classes)",
            )

    plans = check.items(arch, "plans", a)
    if len(plans) != num_members:
        check.fail(
            f"{a}.plans", f"{len(plans)} plan(s)", f"{num_members} (architecture.num_members)"
        )
    trunk = check.items(arch, "trunk", a)
    blocks = check.items(arch, "blocks", a)
    num_layers = len(trunk) + len(blocks)
    if not blocks:
        check.fail(f"{a}.blocks", "0 blocks", "at least one block after the shared trunk")
    embedding = check.mapping(arch, "embedding", a)
    head = check.mapping(arch, "head", a)
    check.mapping(head, "classifier", f"{a}.head")
    if trunk and check.get(embedding, "per_member", f"{a}.embedding") is not False:
        check.fail(
            f"{a}.embedding.per_member",
            _shown(embedding["per_member"]),
            f"false (architecture.trunk has {len(trunk)} shared layer(s))",
        )

    plan_layers = []
    for index, plan in enumerate(plans):
        layers = _plan_layers(check, plan, f"{a}.plans[{index}]")
        if len(layers) != num_layers:
            check.fail(
                f"{a}.plans[{index}]",
                f"{len(layers)} layer(s)",
                f"{num_layers} (len(trunk) {len(trunk)} + len(blocks) {len(blocks)})",
            )
        for layer, heads in enumerate(layers):
            if max(heads) >= layer_heads:
                check.fail(
                    f"{a}.plans[{index}][{str(layer)!r}]",
                    f"head {max(heads)}",
                    f"indices 0..{layer_heads - 1} (the layer has {layer_heads} heads)",
                )
        plan_layers.append(layers)

    for layer in range(num_layers):
        in_trunk = layer < len(trunk)
        field = f"{a}.trunk[{layer}]" if in_trunk else f"{a}.blocks[{layer - len(trunk)}]"
        block = trunk[layer] if in_trunk else blocks[layer - len(trunk)]
        if not isinstance(block, Mapping):
            check.fail(field, _shown(block), "a JSON object")
        if check.get(block, "trunk", field) is not in_trunk:
            check.fail(f"{field}.trunk", _shown(block["trunk"]), _shown(in_trunk))
        attention = check.mapping(block, "attention", field)
        check.choice(
            check.get(attention, "implementation", f"{field}.attention"),
            f"{field}.attention.implementation",
            list(ATTENTION_IMPLEMENTATIONS),
        )
        counts = check.items(attention, "head_counts", f"{field}.attention")
        streams = 1 if in_trunk else num_members
        if len(counts) != streams:
            check.fail(
                f"{field}.attention.head_counts",
                f"{len(counts)} count(s)",
                f"{streams} (one per {'shared stream' if in_trunk else 'member'})",
            )
        for count in counts:
            check.integer(count, f"{field}.attention.head_counts", 1)
            if count > layer_heads:
                check.fail(
                    f"{field}.attention.head_counts",
                    _shown(counts),
                    f"counts <= {layer_heads} (the layer's head count)",
                )
        for index, layers in enumerate(plan_layers):
            recorded = counts[0] if in_trunk else counts[index]
            if len(layers[layer]) != recorded:
                check.fail(
                    f"{a}.plans[{index}][{str(layer)!r}]",
                    f"{len(layers[layer])} head(s) {layers[layer]}",
                    f"{recorded} ({field}.attention.head_counts)",
                )
        if mode == "average":
            _check_nothing_per_member(check, block, field)
    if mode == "average":
        _check_nothing_per_member(check, embedding, f"{a}.embedding")
        _check_nothing_per_member(check, head, f"{a}.head")


def _check_nothing_per_member(check: _Checker, node: Any, field: str) -> None:
    """In ``average`` mode no parameter is stored per member (only attention, which has no flag)."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            name = f"{field}.{key}"
            if key.endswith("per_member") and value is not False:
                check.fail(name, _shown(value), "false (architecture.mode is 'average')")
            if key != "config":
                _check_nothing_per_member(check, value, name)


def _check_against_weights(
    check: _Checker, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> None:
    """Checks of ``hydra.json``'s ``dtype``, ``temperature`` and class count against the weights."""
    arch = config["architecture"]
    dtype_name = check.get(config, "dtype", "")
    dtype = getattr(torch, dtype_name, None) if isinstance(dtype_name, str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        check.fail("dtype", _shown(dtype_name), "a torch floating-point dtype name")
    for name, tensor in state.items():
        if tensor.is_floating_point() and tensor.dtype != dtype:
            check.fail(
                "dtype",
                repr(dtype_name),
                f"{str(tensor.dtype).removeprefix('torch.')!r} ({WEIGHTS_FILE} stores {name!r} "
                f"as {tensor.dtype})",
            )

    recorded = check.get(config, "temperature", "")
    if isinstance(recorded, bool) or not isinstance(recorded, int | float):
        check.fail("temperature", _shown(recorded), "a number")
    try:
        recorded_value = float(recorded)
    except OverflowError:
        check.fail("temperature", _shown(recorded), "a positive finite number")
    buffer = state.get(TEMPERATURE_KEY)
    if buffer is None or buffer.dim() != 0:
        found = "no such tensor" if buffer is None else f"shape {tuple(buffer.shape)}"
        raise HydraFormatError(
            f"{Path(check.source).with_name(WEIGHTS_FILE)}: {TEMPERATURE_KEY}: found {found}, "
            "expected a scalar temperature buffer"
        )
    used = float(buffer.item())
    # The model computes with the buffer: the field must describe exactly that value.
    if recorded_value != used:
        check.fail(
            "temperature",
            repr(recorded),
            f"{used!r} (the temperature buffer in {WEIGHTS_FILE}, which the model uses)",
        )
    if not (math.isfinite(used) and used > 0):
        check.fail("temperature", repr(recorded), "a positive finite number")

    classifier = state.get(CLASSIFIER_WEIGHT_KEY)
    if classifier is not None:
        per_member = arch["head"]["classifier"].get("per_member")
        num_classes = int(classifier.shape[-2]) if classifier.dim() >= 2 else -1
        if classifier.dim() != (3 if per_member else 2) or num_classes != arch["num_classes"]:
            check.fail(
                "architecture.num_classes",
                _shown(arch["num_classes"]),
                f"{num_classes} ({WEIGHTS_FILE}'s {CLASSIFIER_WEIGHT_KEY} has shape "
                f"{tuple(classifier.shape)})",
            )


def _check_tensor_layout(
    check: _Checker, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> None:
    """The tensors the architecture describes (names and shapes) are exactly those in the weights.

    The architecture is instantiated on the meta device: no memory, no initialisation.
    """
    try:
        with torch.device("meta"):
            expected = HydraEnsemble(config["architecture"]).state_dict()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        check.fail(
            "architecture", one_line(f"{type(error).__name__}: {error}"), "a buildable model"
        )
    weights = Path(check.source).with_name(WEIGHTS_FILE)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        check.fail(
            "architecture",
            f"tensors {missing[:3]} missing from {weights.name}"
            if missing
            else f"tensors {unexpected[:3]} in {weights.name} that it does not describe",
            f"the tensor names of {weights.name}",
        )
    for name in sorted(expected):
        if tuple(expected[name].shape) != tuple(state[name].shape):
            check.fail(
                "architecture",
                f"{name!r} of shape {tuple(expected[name].shape)}",
                f"{tuple(state[name].shape)}, its shape in {weights.name}",
            )
