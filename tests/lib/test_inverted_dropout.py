"""hydra_ops.models.inverted_dropout: both samplers draw nn.Dropout's distribution (keep rate,
scale, independence between positions), the gap sampler's positions are a Bernoulli process
however many blocks it draws, and draws are reproducible from the generator alone."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from hydra_ops.models import inverted_dropout as module
from hydra_ops.models.inverted_dropout import (
    DropoutSampler,
    bernoulli_positions,
    inverted_dropout,
    resolve_implementation,
    sampled_dropout,
    training_sampler,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def within(observed: float, expected: float, n: int, sds: float = 4.0) -> bool:
    """``observed`` frequency within ``sds`` binomial standard errors of ``expected``."""
    return abs(observed - expected) < sds * (expected * (1 - expected) / n) ** 0.5


@pytest.mark.parametrize("q", [0.02, 0.1, 0.5, 0.9])
def test_positions_are_sorted_in_range_and_binomial(q):
    n, draws = 50_000, 20
    counts = torch.zeros(n)
    for seed in range(draws):
        pos = bernoulli_positions(n, q, gen(seed))
        assert pos.dtype == torch.int64
        assert (pos.diff() > 0).all() and pos.min() >= 0 and pos.max() < n
        counts[pos] += 1
    assert within(counts.sum().item() / (n * draws), q, n * draws)
    # every part of the range is hit at rate q: first, middle and last tenth alike
    for part in counts.chunk(10)[:1] + counts.chunk(10)[4:5] + counts.chunk(10)[-1:]:
        assert within(part.mean().item() / draws, q, part.numel() * draws)


def test_several_blocks_give_the_same_process(monkeypatch):
    """Blocks sized without spare (most draws need a second block) still give a Bernoulli
    process: the rate, and no dent or pile-up where a block ends."""
    monkeypatch.setattr(module, "SPARE_SDS", 0.0)
    monkeypatch.setattr(module, "SPARE", 0)
    n, q, draws = 2_000, 0.25, 400
    counts = torch.zeros(n)
    for seed in range(draws):
        pos = bernoulli_positions(n, q, gen(seed))
        assert (pos.diff() > 0).all() and pos.max() < n
        counts[pos] += 1
    assert within(counts.sum().item() / (n * draws), q, n * draws)
    assert within(counts[-200:].mean().item() / draws, q, 200 * draws)
    # a block without spare ends before n about half the time: the loop really ran
    original = torch.Tensor.geometric_
    calls = []

    def counting(self, *args, **kwargs):
        calls.append(self.numel())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "geometric_", counting)
    for seed in range(20):
        bernoulli_positions(n, q, gen(seed))
    assert len(calls) > 25  # 20 draws


def test_edge_sizes_and_rates():
    assert bernoulli_positions(0, 0.3, gen(0)).numel() == 0
    assert torch.equal(bernoulli_positions(5, 1.0, gen(0)), torch.arange(5))
    with pytest.raises(ValueError, match="q must be"):
        bernoulli_positions(5, 0.0, gen(0))


@pytest.mark.parametrize("implementation", ["dense", "gaps"])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.7])
def test_both_samplers_draw_nn_dropouts_distribution(implementation, p):
    n = 400_000
    ones = torch.ones(2, n // 2)
    out = inverted_dropout(ones, p, gen(1), implementation)
    assert out.shape == ones.shape and out.dtype == ones.dtype
    kept = out != 0
    assert within(kept.float().mean().item(), 1 - p, n)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        reference = nn.Dropout(p).train()(torch.ones(1000))  # nn.Dropout's scale, to the bit
    assert torch.equal(out[kept].unique(), reference[reference != 0].unique())
    # neighbouring positions are independent: P(both of a pair kept) = (1 - p)^2
    flat = kept.reshape(-1).float()
    both = (flat[0::2] * flat[1::2]).mean().item()
    assert within(both, (1 - p) ** 2, n // 2)


@pytest.mark.parametrize("p", [0.1, 0.6])
def test_kept_values_equal_nn_dropouts_bit_for_bit_in_bf16(p):
    x = torch.randn(64, 96, generator=gen(2)).bfloat16()
    out = inverted_dropout(x, p, gen(3), "gaps")
    kept = out != 0
    scale = torch.ones((), dtype=torch.bfloat16).div_(1 - p)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[kept], (x * (torch.ones_like(x) * scale))[kept])
    assert not torch.equal(out, x * scale)  # something was dropped


def test_draws_come_from_the_generator_alone():
    x = torch.randn(1000)
    state = torch.random.get_rng_state()
    a = inverted_dropout(x, 0.2, gen(7))
    b = inverted_dropout(x, 0.2, gen(7))
    c = inverted_dropout(x, 0.2, gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not x.eq(a).all()  # x itself untouched: a is a new tensor
    assert inverted_dropout(x, 0.0, gen(7)) is x


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="p must be"):
        inverted_dropout(torch.ones(3), 1.0, gen(0))
    with pytest.raises(ValueError, match="implementation must be one of"):
        inverted_dropout(torch.ones(3), 0.1, gen(0), "fast")
    assert resolve_implementation("auto", torch.device("cpu")) == "gaps"
    assert resolve_implementation("auto", torch.device("cuda")) == "dense"
    assert resolve_implementation("dense", torch.device("cpu")) == "dense"


@pytest.mark.parametrize("implementation", ["dense", "gaps"])
@pytest.mark.parametrize("p", [0.2, 0.8])
def test_stacked_blocks_draw_what_they_draw_alone(implementation, p):
    """Block i of a stacked input gets exactly what generator i gives it alone (MC Dropout's
    passes stacked along the batch)."""
    x = torch.randn(3 * 5, 7, 11, generator=gen(4))
    stacked = inverted_dropout(x, p, [gen(10), gen(11), gen(12)], implementation)
    alone = [inverted_dropout(b, p, gen(10 + i), implementation) for i, b in enumerate(x.chunk(3))]
    assert torch.equal(stacked, torch.cat(alone))
    with pytest.raises(ValueError, match="not 2 stacked blocks"):
        inverted_dropout(torch.ones(3, 4), p, [gen(0), gen(1)], implementation)


@pytest.mark.parametrize("p", [0.3, 0.7])
def test_the_sampler_mode_reroutes_training_nn_dropout_with_its_gradient(p):
    drop = nn.Dropout(p).train()
    x = torch.randn(8, 500, requires_grad=True)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        with sampled_dropout("gaps"):
            y = drop(x)
        torch.manual_seed(5)
        expected = inverted_dropout(x.detach(), p, None, "gaps")
    assert torch.equal(y.detach(), expected)
    y.sum().backward()
    assert torch.equal(x.grad, (expected != 0).float() * (1 / (1 - p)))
    # eval mode, p = 0 and in-place calls run torch's own dropout, untouched
    with sampled_dropout("gaps"):
        assert drop.eval()(x) is x
        assert nn.Dropout(0.0).train()(x) is x
        z = torch.ones(1000)
        torch.nn.functional.dropout(z, 0.5, True, inplace=True)
        assert {0.0, 2.0} == set(z.unique().tolist())
    assert isinstance(sampled_dropout("dense"), contextlib.nullcontext)
    assert isinstance(sampled_dropout("auto", torch.device("cuda")), contextlib.nullcontext)
    assert isinstance(sampled_dropout("auto"), DropoutSampler)
    assert training_sampler(torch.device("cpu"), "bf16") == "gaps"
    assert training_sampler(torch.device("cpu"), "fp32") == "dense"
    assert training_sampler(torch.device("cuda"), "bf16") == "dense"


@pytest.mark.parametrize(
    "case", ["plain", "bool_mask", "float_mask", "causal", "gqa", "scale", "bf16"]
)
def test_sampled_attention_without_dropout_is_torchs_attention(case):
    g = gen(6)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 4, 7, 6, generator=g)
    kwargs: dict = {}
    if case == "bool_mask":
        kwargs["attn_mask"] = torch.rand(2, 1, 5, 7, generator=g) > 0.3
        kwargs["attn_mask"][..., 0] = True  # every query attends to something
    if case == "float_mask":
        kwargs["attn_mask"] = torch.randn(2, 1, 5, 7, generator=g)
    if case == "causal":
        k, v = k[..., :5, :], v[..., :5, :]
        kwargs["is_causal"] = True
    if case == "gqa":
        k, v = k[:, :2], v[:, :2]
        kwargs["enable_gqa"] = True
    if case == "scale":
        kwargs["scale"] = 0.7
    if case == "bf16":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    ours = module.sampled_attention(q, k, v, **kwargs)
    with sdpa_kernel(SDPBackend.MATH):
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    tol = 8e-3 if case == "bf16" else 1e-6
    torch.testing.assert_close(ours, theirs, rtol=0, atol=tol)


def test_the_sampler_mode_draws_the_attention_dropout_of_a_training_bert():
    """Inside the mode a training BERT's attention probabilities are dropped by the sampler: the
    attention call is rerouted (counted), and it matches the formula with the sampler's mask."""
    from tiny_models import tiny_inputs, tiny_model

    calls = []
    original = module.sampled_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0))
        return original(*args, **kwargs)

    model = tiny_model("bert").train()
    inputs = tiny_inputs("bert", 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "sampled_attention", counting)
        with sampled_dropout("gaps"):
            model(**{k: v for k, v in inputs.items() if k != "labels"}).logits.sum().backward()
    assert calls and all(p > 0 for p in calls)
    # the formula, with the mask the sampler draws from the same seed
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen(s)) for s in (20, 21, 22))
    with torch.random.fork_rng():
        torch.manual_seed(9)
        with sampled_dropout("gaps"):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
        torch.manual_seed(9)
        weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
        expected = inverted_dropout(weights, 0.4, None, "gaps") @ v
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    # dropout_p = 0 (inference) is torch's own kernel, untouched
    with sampled_dropout("gaps"):
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(plain, torch.nn.functional.scaled_dot_product_attention(q, k, v))
