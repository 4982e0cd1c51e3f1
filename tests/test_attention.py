"""The three attention backends agree, and chunked attention really saves memory."""

import math

import pytest
import torch

from minibert.model.attention import (
    _ChunkedAttention,
    _tile_keep_mask,
    attention,
    key_padding_bias,
    math_attention,
)


def _qkv(B=2, nh=3, T=45, hs=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, nh, T, hs, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _keep(B, T, lengths):
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T) bool


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
@pytest.mark.parametrize("T, chunk", [(45, 16), (64, 16), (7, 16), (33, 1)])
def test_backends_agree_forward_and_backward(backend, T, chunk):
    q, k, v = _qkv(T=T)
    keep = _keep(2, T, [T, max(1, T - 12)])  # padding in the second sequence
    grad_out = torch.randn(2, 3, T, 16, generator=torch.Generator().manual_seed(1))
    ref = attention(q, k, v, keep, "math")
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    out = attention(q, k, v, keep, backend, chunk_size=chunk)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    real = keep[:, None, :, None].expand_as(out)
    assert (out - ref)[real].abs().max() <= 1e-5
    for g, r in zip(grads, ref_grads):
        assert (g - r).norm() / r.norm() <= 1e-4


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("chunk", [8, 32])
def test_chunked_matches_math_on_a_sequence_of_padding_only(dtype, tol, chunk):
    """A batch row whose keys are all padding: every score is the bias minimum, so math's
    softmax gives the uniform distribution (the output is the mean of v), and its gradients
    are the softmax Jacobian at that uniform point. Chunked must give the same, forward and
    backward (it once rebuilt P = 1 instead of 1/T there, gradients off by ~19)."""
    q, k, v = _qkv(B=2, nh=3, T=20, hs=8, dtype=dtype)
    keep = _keep(2, 20, [13, 0])  # row 1: no real token at all
    grad_out = torch.randn(2, 3, 20, 8, dtype=dtype, generator=torch.Generator().manual_seed(1))
    ref = attention(q, k, v, keep, "math")
    assert (ref[1] - v[1].mean(dim=-2, keepdim=True)).abs().max() <= tol  # uniform
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    out = attention(q, k, v, keep, "chunked", chunk_size=chunk)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    assert (out - ref).abs().max() <= tol
    for name, g, r in zip("qkv", grads, ref_grads):
        assert (g - r).abs().max() <= tol * r.abs().max(), name


def test_chunked_without_mask_and_in_float64_is_exact():
    q, k, v = _qkv(T=50, dtype=torch.float64)
    out = attention(q, k, v, None, "chunked", chunk_size=8)
    assert (out - math_attention(q, k, v, None)).abs().max() <= 1e-12


def test_chunked_dropout_equals_math_with_the_same_mask():
    """Dropout in chunked attention: the tile masks, assembled, drive the reference formula."""
    q, k, v = _qkv(B=1, nh=2, T=20, hs=8, dtype=torch.float64)
    keep = _keep(1, 20, [17])
    bias = key_padding_bias(keep, torch.float64)
    p, chunk, seed = 0.3, 8, 1234
    out = _ChunkedAttention.apply(q, k, v, bias, chunk, p, seed, None)
    n = math.ceil(20 / chunk)
    full = torch.zeros(1, 2, 20, 20, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            rows, cols = slice(i * chunk, (i + 1) * chunk), slice(j * chunk, (j + 1) * chunk)
            shape = full[:, :, rows, cols].shape
            full[:, :, rows, cols] = _tile_keep_mask(seed, i * n + j, shape, p, q.device,
                                                     torch.float64)
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, dim=-1)
    ref = (probs * full) @ v
    assert 0.2 < (full == 0).double().mean() < 0.4  # the mask really drops about p of links
    assert (out - ref).abs().max() <= 1e-12
    g, r = torch.autograd.grad(out.sum(), q)[0], torch.autograd.grad(ref.sum(), q)[0]
    assert (g - r).abs().max() <= 1e-10


def test_chunked_dropout_gradcheck():
    q, k, v = _qkv(B=1, nh=2, T=10, hs=4, dtype=torch.float64)
    bias = key_padding_bias(_keep(1, 10, [7]), torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: _ChunkedAttention.apply(a, b, c, bias, 4, 0.3, 7, None), (q, k, v))


def test_chunked_runs_in_bfloat16():
    q, k, v = _qkv(T=40, dtype=torch.bfloat16)
    out = attention(q, k, v, None, "chunked", chunk_size=16)
    ref = attention(q.float(), k.float(), v.float(), None, "math")
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 3e-2
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("window", [None, 12])
def test_chunked_bfloat16_gradients_are_maths_in_float32(window):
    """bf16 tiles reuse their buffers in place (`kernels.TileBuffers`): the gradients must
    still be the formula's, to bf16's rounding, with a short last tile, padding and a window."""
    q, k, v = _qkv(T=40, dtype=torch.bfloat16)
    keep = torch.ones(q.size(0), 40, dtype=torch.bool)
    keep[0, 33:] = False  # padding in the short last tile
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    out = attention(q, k, v, keep, "chunked", chunk_size=16, window=window)
    out.float().backward(grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    attention(q32, k32, v32, keep, "math", window=window).backward(grad)
    for low, ref in ((q.grad, q32.grad), (k.grad, k32.grad), (v.grad, v32.grad)):
        assert (low.float() - ref).abs().max() < 0.03 * ref.abs().max()


def _saved_bytes(fn):
    """Bytes of all tensors autograd saves for the backward pass while running fn()."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def test_chunked_saves_no_quadratic_tensor():
    """Training memory: math keeps (T, T) probabilities for backward, chunked keeps O(T)."""
    T, hs = 1024, 16
    q, k, v = _qkv(B=1, nh=2, T=T, hs=hs)
    math_bytes = _saved_bytes(lambda: attention(q, k, v, None, "math"))
    chunk_bytes = _saved_bytes(lambda: attention(q, k, v, None, "chunked", chunk_size=64))
    quadratic = 2 * T * T * 4  # one (nh, T, T) fp32 tensor
    assert math_bytes >= quadratic
    linear = 2 * T * hs * 4  # one (nh, T, hs) fp32 tensor
    assert chunk_bytes <= 5 * linear  # q, k, v, out and two (nh, T) softmax statistics
    assert chunk_bytes < 0.1 * quadratic


def test_dropout_statistics_gradient_and_reproducibility():
    from minibert.machine.kernels import dropout

    # Never zero, so that y == 0 marks exactly the dropped elements. An exact 0.0 from randn
    # (in 3 of 30 generator states tried, at this size) made the test fail now and then,
    # depending on what earlier tests had drawn.
    x = torch.empty(64, 128, 96).uniform_(0.5, 1.5).requires_grad_()
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - 0.1) < 0.003  # 786k draws: sd ~ 3e-4
    # The survivors are scaled for the rate drawn, 3277 / 32768 (not 0.1): the expectation
    # is then exact, where 1 / 0.9 was off by 7e-6 of it.
    scale = 32768 / (32768 - 3277)
    assert torch.equal(y[~dropped], x[~dropped] * scale)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, (~dropped).float() * scale)  # gradient flows through kept elements
    assert torch.equal(dropout(x, 1e-6), x)  # a rate below 1/65536 drops, and scales, nothing
    assert not dropout(x, 1.0).any()
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1), y)  # the seed fixes the mask
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    # no structure across the four lanes of one 64-bit draw
    lanes = dropped.flatten()[: dropped.numel() // 4 * 4].view(-1, 4).float().mean(0)
    assert (lanes - 0.1).abs().max() < 0.006
    yb = dropout(x.detach().bfloat16(), 0.5)
    assert yb.dtype == torch.bfloat16 and abs((yb == 0).float().mean().item() - 0.5) < 0.005




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, dropout_p", [(None, 0.0), (12, 0.0), (None, 0.2)])
def test_the_machine_rooms_tile_buffers_give_the_plain_tiles_values(dtype, window, dropout_p):
    """`kernels.TileBuffers` (what `minibert.fast` gives chunked attention on a CPU) writes
    each tile's products into buffers made once; the textbook's `Tiles` makes them fresh. The
    outputs and the gradients are the same, bit for bit."""
    from minibert.machine.kernels import TileBuffers
    from minibert.model.attention import Tiles

    q, k, v = _qkv(T=40, dtype=dtype)
    is_token = _keep(2, 40, [40, 29])
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    results = []
    for tiles in (Tiles, TileBuffers):
        torch.manual_seed(0)  # the dropout seed
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = attention(qq, kk, vv, is_token, "chunked", dropout_p=dropout_p, chunk_size=16,
                        window=window, tiles=tiles)
        out.backward(grad)
        results.append((out, qq.grad, kk.grad, vv.grad))
    assert all(torch.equal(a, b) for a, b in zip(*results))
