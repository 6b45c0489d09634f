"""hydra_ops.hydra.grouped: the grouped attention implementations read and write member-major
streams without activation copies."""

import torch
from tiny_models import (
    make_members,
    member_plans,
    positional,
    tiny_inputs,
)
from torch.utils._python_dispatch import TorchDispatchMode

from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
from hydra_ops.hydra.merge import merge_members


# ----- member-major streams: no layout copies --------------------------------------------------
class _CopyLog(TorchDispatchMode):
    """Sizes (elements) of every clone / cat / stack / copy_ run under it."""

    def __init__(self):
        super().__init__()
        self.ops = {"clone", "contiguous", "cat", "stack", "copy_", "copy"}
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.ops:
            self.sizes.append((out if isinstance(out, torch.Tensor) else args[0]).numel())
        return out


def _block_inputs(hydra, batch):
    seen = []
    hooks = [
        block.register_forward_hook(lambda _m, args, out: seen.append((args, out)))
        for block in [*hydra.trunk, *hydra.blocks]
    ]
    with torch.no_grad():
        hydra(*positional(batch))
    for hook in hooks:
        hook.remove()
    return seen


def test_padded_bmm_block_makes_no_activation_copies():
    members = make_members("bert", member_plans(3, unequal=True), fine_tuned=True)
    hydra = merge_members(members, attention="padded_bmm")
    batch = tiny_inputs("bert", 4, padded=True)
    (x, mask), _ = _block_inputs(hydra, batch)[1]
    for block_attention in ("padded_bmm", "member_gemm"):
        block = hydra.blocks[1]
        block.attention = block.attention.to_implementation(
            ATTENTION_IMPLEMENTATIONS[block_attention]
        )
        log = _CopyLog()
        with torch.no_grad(), log:
            block(x, mask)
        # only the [M*B, 1, 1, T] boolean mask may be copied; member_gemm stacks its M outputs
        big = [n for n in log.sizes if n > mask.numel() * 3]
        assert big == ([] if block_attention == "padded_bmm" else [x.numel()])
