"""Scaled dot-product attention, three ways, side by side.

All three compute the same thing (Vaswani et al. 2017):

    Attention(Q, K, V) = softmax(Q Kᵀ / √hs + bias) V

for q, k, v of shape (B, nh, T, hs) and an additive key-padding bias of shape (B, 1, 1, T)
(0 for a real token, a very negative number for padding). They differ in how much memory
they need and how readable they are:

* `math_attention` writes the formula out. It materialises the (B, nh, T, T) score matrix,
  and autograd keeps the probabilities for the backward pass, so training memory is O(T²).
  Read this one first.
* `sdpa_attention` calls `torch.nn.functional.scaled_dot_product_attention`, which picks a
  fused kernel (FlashAttention, memory-efficient, or C++ math) for the device. The default.
* `chunked_attention` is exact attention in O(T · chunk) training memory, written in plain
  PyTorch so that a reader can see how the FlashAttention idea works: the derivation, then
  the forward pass, then the backward pass.

`attention()` dispatches on the backend name held in `BertConfig.attention`. The tests check
that all three agree to 1e-5 in the forward pass and 1e-4 in the gradients.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor



def window_bias(is_token: Optional[Tensor], T: int, window: int, dtype: torch.dtype,
                device: torch.device) -> Tensor:
    """The bias of a local (sliding-window) layer: query i sees key j only when |i - j| <=
    `window` and j is a real token. (B or 1, 1, T, T) in `dtype`, 0 or the dtype's minimum.

    One bias for both rules, built from a boolean mask, so a key outside the window *and*
    on padding gets the minimum once, not twice (which would overflow to -inf).
    """
    pos = torch.arange(T, device=device)
    allowed = (pos[:, None] - pos[None, :]).abs() <= window  # (T, T): the band
    allowed = allowed[None, None] if is_token is None else allowed & is_token[:, None, None, :]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)


def key_padding_bias(is_token: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, T) bool mask, True for real tokens -> (B, 1, 1, T) additive bias in `dtype`.

    We use the most negative finite number rather than -inf, as BERT always has: a row whose
    keys are all padding then gets a uniform (harmless) distribution instead of NaN.
    """
    bias = torch.zeros(is_token.shape, dtype=dtype, device=is_token.device)
    bias.masked_fill_(~is_token, torch.finfo(dtype).min)
    return bias[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries


def attention_bias(is_token: Optional[Tensor], T: int, window: Optional[int], dtype: torch.dtype,
                   device: torch.device) -> Optional[Tensor]:
    """A layer's additive score bias: band and padding (local), padding (global), or None."""
    if window is not None:
        return window_bias(is_token, T, window, dtype, device)  # (B or 1, 1, T, T)
    return None if is_token is None else key_padding_bias(is_token, dtype)  # (B, 1, 1, T)


def attention_probs(q: Tensor, k: Tensor, bias: Optional[Tensor]) -> Tensor:
    """softmax(Q Kᵀ / √hs + bias): (B, nh, T, hs) x2 -> (B, nh, T, T), each row summing to 1."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    if bias is not None:
        scores = scores + bias  # padding keys get ~-inf, so softmax gives them weight 0
    return torch.softmax(scores, dim=-1)  # each query's weights over keys sum to 1


def math_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                   dropout_p: float = 0.0) -> Tensor:
    """The textbook formula. (B, nh, T, hs) x3 -> (B, nh, T, hs)."""
    # BERT drops whole attention links: a query randomly ignores some keys during training.
    probs = F.dropout(attention_probs(q, k, bias), dropout_p)
    return probs @ v  # (B, nh, T, hs)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                   dropout_p: float = 0.0) -> Tensor:
    """PyTorch's fused kernel. With no padding mask it may use FlashAttention on CUDA."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)


# ---------------------------------------------------------------------------------------------
# Chunked attention
# ---------------------------------------------------------------------------------------------
# Why not simply loop over query chunks under autograd, as is often suggested?
#
#     for i in range(0, T, c):
#         out.append(softmax(Q[i:i+c] @ Kᵀ) @ V)
#
# That lowers the *forward* peak, but autograd saves every chunk's probability matrix for the
# backward pass, so a training step still stores all T² probabilities (Rabe & Staats 2021,
# "Self-attention does not need O(n²) memory", make the same point). The memory goes away
# only if the backward pass recomputes the probabilities instead of saving them, which is
# what FlashAttention (Dao et al. 2022) does in a fused kernel. Here the same algorithm is
# written in PyTorch, inside a torch.autograd.Function:
#
# Forward, for each query block Qi, visit the key blocks Kj, Vj with an *online softmax*:
#     S   = Qi Kjᵀ · scale + bias_j                       (B, nh, c, c), the only big temporary
#     m'  = max(m, rowmax(S))                             running row maximum
#     l   = l · exp(m - m') + rowsum(exp(S - m'))         running softmax denominator
#     acc = acc · exp(m - m') + exp(S - m') Vj            running numerator
# then Oi = acc / l, and we keep only m and log l, each (B, nh, c), for the backward pass
# (l is `row_sum` in the code). FlashAttention keeps their sum, lse = m + log l, instead; we
# keep them apart because of a sequence that is all padding: every score of its rows is the
# bias minimum, m is that minimum too, and m + log l rounds back to m (log l ≤ log T is far
# below the spacing of floats that large), so exp(S - lse) would rebuild P = 1, not 1/T.
# exp((S - m) - log l) is exact there, and equal to exp(S - lse) elsewhere up to rounding.
#
# Backward, with P = exp((S - m) - log l) recomputed block by block and D = rowsum(dO ∘ O):
#     dV_j += Pᵀ dO_i          dP = dO_i V_jᵀ          dS = P ∘ (dP - D_i)
#     dQ_i += dS K_j · scale   dK_j += dSᵀ Q_i · scale
# (D_i = Σ_j P_ij dP_ij is the softmax Jacobian's correction term; rowsum(dO ∘ O) is the
# cheap way to get it.) Saved tensors: q, k, v, out, m and log l, all O(T), none O(T²).
#
# That all-padding case, defined by `math_attention`: the bias is finite (see
# `key_padding_bias`), so the row's softmax is uniform and its output the mean of V; the
# gradients are the softmax Jacobian at that uniform P. Chunked matches both (tested). torch's
# fused CPU kernel behind `sdpa` has the lse rounding above and differs in the backward there.
# In a local (windowed) layer the two differ on such a row: `math` averages V over all T
# keys, chunked over the tiles it visits near the row. Neither value is used: the encoder
# drops padding rows (`unpad`), so they give no output and no gradient.
#
# Attention dropout is supported: each (query block, key block) tile draws its keep-mask
# from its own generator seeded with (seed, tile index), so the backward pass regenerates
# exactly the forward's mask without storing it. The dropout acts on the normalised
# probabilities, as in BERT: the denominator l sums the probabilities *before* dropout.


class Tiles:
    """Each tile's products as fresh tensors: the plain form of the two calls the loops below
    make per tile. (`minibert.fast` gives a model on a CPU `kernels.TileBuffers`, which writes
    the same values into buffers made once per pass: machine room, §7.)"""

    def __init__(self, like: Tensor) -> None:
        pass

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        """a @ b in the softmax statistics' dtype (fp32 for bf16/fp16 inputs, whose product
        is rounded to their dtype first, as `math`'s scores are): (B, nh, rows, cols)."""
        return (a @ b).to(_stats_dtype(a))

    def low(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """x in the matmul dtype."""
        return x.to(dtype)


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                      dropout_p: float = 0.0, chunk_size: int = 512,
                      window: Optional[int] = None, tiles: type = Tiles) -> Tensor:
    """Exact attention whose training memory is O(T · chunk_size) instead of O(T²).

    Queries and keys are processed in tiles of `chunk_size` with an online softmax, and the
    backward pass recomputes each tile's probabilities instead of saving them (the
    FlashAttention algorithm; the derivation is in the comment above). Looping over chunks
    under plain autograd would *not* save training memory, because autograd would keep every
    chunk's probabilities for the backward pass.

    (B, nh, T, hs) x3 -> (B, nh, T, hs). Lengths need not be multiples of `chunk_size`.
    With a `window` (a local layer), tiles with no (query, key) pair within `window` of
    each other are never computed: the work grows as T · window instead of T².
    `tiles`: the class that makes each tile's products (`Tiles`, fresh tensors).
    """
    # The dropout seed comes from torch's global generator, so `set_seed` makes it repeatable.
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    if bias is not None:
        bias = bias.to(_stats_dtype(q))
    return _ChunkedAttention.apply(q, k, v, bias, chunk_size, dropout_p, seed, window, tiles)


def _tile_keep_mask(seed: int, tile: int, shape: torch.Size, p: float, device: torch.device,
                    dtype: torch.dtype) -> Tensor:
    """The dropout keep-mask of one tile (nonzero where a probability survives), scaled by
    1/(1-p); the same on every call."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + tile)
    survives = torch.rand(shape, generator=gen, device=device) >= p
    return survives.to(dtype) / (1.0 - p)


def _stats_dtype(x: Tensor) -> torch.dtype:
    # Softmax statistics stay in at least fp32 even when the matmuls run in bf16/fp16.
    return torch.promote_types(x.dtype, torch.float32)


def _outside(rows: slice, cols: slice, T: int, window: Optional[int]) -> bool:
    """True when no query of `rows` is within `window` of a key of `cols`: a skipped tile."""
    if window is None:
        return False
    r1, c1 = min(rows.stop, T) - 1, min(cols.stop, T) - 1  # the last row and column
    return cols.start - r1 > window or rows.start - c1 > window


def _scores(qs_i: Tensor, kj: Tensor, bias: Optional[Tensor], rows: slice, cols: slice,
            window: Optional[int], tiles: Tiles) -> Tensor:
    """One tile's scores from the pre-scaled queries `qs_i` = q_i / √hs, plus its bias:
    (B, nh, cq, ck), in the statistics dtype, in the tile buffer "s" (the next tile
    overwrites it). A tile that the window's edge cuts gets the dtype's minimum outside the
    band."""
    s = tiles.matmul("s", qs_i, kj.transpose(-2, -1))  # (B, nh, cq, ck)
    if bias is not None:
        s.add_(bias[..., cols])
    r_last, c_last = rows.start + qs_i.size(2) - 1, cols.start + kj.size(2) - 1
    if window is not None and max(r_last - cols.start, c_last - rows.start) > window:
        # The window's edge cuts this tile (a tile wholly inside needs no mask).
        r = torch.arange(rows.start, rows.start + qs_i.size(2), device=s.device)
        c = torch.arange(cols.start, cols.start + kj.size(2), device=s.device)
        far = (r[:, None] - c[None, :]).abs() > window  # (cq, ck)
        s.masked_fill_(far, torch.finfo(s.dtype).min)
    return s


# The loops below keep the work outside each tile's two matmuls small: the scale is folded
# into q once, the first key tile of a row block starts the running statistics instead of
# rescaling zeros, the elementwise steps run in place in each tile's scores, and dQ_i is
# summed in a local and scaled once.

class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], chunk: int,
                dropout_p: float, seed: int, window: Optional[int],
                tiles_of: type = Tiles) -> Tensor:
        B, nh, T, hs = q.shape
        qs = q * (1.0 / math.sqrt(hs))  # the softmax scale, folded into q
        n_blocks = (T + chunk - 1) // chunk
        out = torch.empty_like(q)
        f32 = _stats_dtype(q)
        row_max = torch.empty(B, nh, T, 1, dtype=f32, device=q.device)  # m of each query row
        log_sum = torch.empty_like(row_max)  # log l of each query row
        tiles = tiles_of(q)
        for i in range(n_blocks):
            rows = slice(i * chunk, (i + 1) * chunk)
            qs_i = qs[:, :, rows]  # (B, nh, cq, hs)
            m = row_sum = acc = None  # set by the first key tile the row block sees
            for j in range(n_blocks):
                cols = slice(j * chunk, (j + 1) * chunk)
                if _outside(rows, cols, T, window):
                    continue
                s = _scores(qs_i, k[:, :, cols], bias, rows, cols, window, tiles)
                tile_max = s.amax(dim=-1, keepdim=True)
                m_new = tile_max if m is None else torch.maximum(m, tile_max)
                p = s.sub_(m_new).exp_()  # exp(S - m'), in the scores' buffer
                tile_sum = p.sum(dim=-1, keepdim=True)
                if m is None:
                    row_sum = tile_sum
                else:
                    correction = torch.exp(m - m_new)  # rescales what was summed under the old max
                    row_sum = row_sum * correction + tile_sum
                if dropout_p > 0:
                    p.mul_(_tile_keep_mask(seed, i * n_blocks + j, p.shape, dropout_p,
                                           q.device, p.dtype))
                pv = (tiles.low(p, v.dtype) @ v[:, :, cols]).to(f32)  # (B, nh, cq, hs)
                acc = pv if m is None else acc.mul_(correction).add_(pv)
                m = m_new
            out[:, :, rows] = (acc / row_sum).to(q.dtype)
            row_max[:, :, rows] = m
            log_sum[:, :, rows] = torch.log(row_sum)
        ctx.save_for_backward(q, k, v, bias, out, row_max, log_sum)
        ctx.chunk, ctx.dropout_p, ctx.seed, ctx.window = chunk, dropout_p, seed, window
        ctx.tiles_of = tiles_of
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, bias, out, row_max, log_sum = ctx.saved_tensors
        chunk, dropout_p, seed, window = ctx.chunk, ctx.dropout_p, ctx.seed, ctx.window
        B, nh, T, hs = q.shape
        scale = 1.0 / math.sqrt(hs)
        qs = q * scale
        n_blocks = (T + chunk - 1) // chunk
        f32 = _stats_dtype(q)
        dq = torch.empty(q.shape, dtype=f32, device=q.device)  # (B, nh, T, hs)
        dk = torch.zeros_like(dq)  # (B, nh, T, hs)
        dv = torch.zeros_like(dq)  # (B, nh, T, hs)
        tiles = ctx.tiles_of(q)
        # D_i = Σ_j P_ij dP_ij, the softmax Jacobian's correction, (B, nh, T, 1). It equals
        # rowsum(dO ∘ O) with dropout too: O = (P ∘ M) V for the scaled keep-mask M, and the
        # dP below is taken against P through that same M, so Σ_j P_ij M_ij (dO_i · V_j) is
        # dO_i · O_i.
        D = (d_out.to(f32) * out.to(f32)).sum(dim=-1, keepdim=True)
        for i in range(n_blocks):
            rows = slice(i * chunk, (i + 1) * chunk)
            qs_i, d_oi, D_i = qs[:, :, rows], d_out[:, :, rows], D[:, :, rows]
            m_i, log_l_i = row_max[:, :, rows], log_sum[:, :, rows]  # (B, nh, cq, 1)
            dq_i = torch.zeros(qs_i.shape, dtype=f32, device=q.device)  # (B, nh, cq, hs)
            for j in range(n_blocks):
                cols = slice(j * chunk, (j + 1) * chunk)
                if _outside(rows, cols, T, window):
                    continue
                kj, vj = k[:, :, cols], v[:, :, cols]
                # (S - m) first: exact even where S and m are both the bias minimum
                s = _scores(qs_i, kj, bias, rows, cols, window, tiles)
                p = s.sub_(m_i).sub_(log_l_i).exp_()  # P, (B, nh, cq, ck), in s's buffer
                dp = tiles.matmul("dp", d_oi, vj.transpose(-2, -1))  # (B, nh, cq, ck)
                if dropout_p > 0:
                    survives = _tile_keep_mask(seed, i * n_blocks + j, p.shape, dropout_p,
                                               q.device, p.dtype)
                    dv[:, :, cols] += ((p * survives).transpose(-2, -1).to(q.dtype) @ d_oi).to(f32)
                    dp.mul_(survives)
                else:
                    dv[:, :, cols] += (tiles.low(p, q.dtype).transpose(-2, -1) @ d_oi).to(f32)
                ds = tiles.low(dp.sub_(D_i).mul_(p), q.dtype)  # dS = P ∘ (dP - D_i)
                dq_i += (ds @ kj).to(f32)
                dk[:, :, cols] += (ds.transpose(-2, -1) @ qs_i).to(f32)  # dSᵀ Q_i · scale
            dq[:, :, rows] = dq_i * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def attention(q: Tensor, k: Tensor, v: Tensor, is_token: Optional[Tensor], backend: str,
              dropout_p: float = 0.0, chunk_size: int = 512,
              window: Optional[int] = None, tiles: type = Tiles) -> Tensor:
    """Dispatch to one backend. `is_token` is the (B, T) bool mask of real tokens, or None;
    `window`: a local layer's reach (query i sees keys j with |i - j| <= window), or None
    for global attention.

    math and sdpa take the window as part of one (B, 1, T, T) bias (`window_bias`), the
    memory they spend on scores anyway; chunked skips the tiles outside the window, so a
    local layer costs O(T · window) there, and adds the band only to the tiles it cuts.

    Under `torch.export` a chunked model runs sdpa instead: chunked's loops over tiles are
    Python loops, whose count a traced length cannot set, so an exported program would be
    fixed to the length it was traced at. sdpa computes the same attention (the tests hold
    all three equal), so the program takes any length; it spends sdpa's memory, not
    chunked's, which matters for training, not for the inference an export serves.
    """
    if backend == "chunked" and not torch.compiler.is_exporting():
        bias = None if is_token is None else key_padding_bias(is_token, q.dtype)
        return chunked_attention(q, k, v, bias, dropout_p, chunk_size, window, tiles)
    bias = attention_bias(is_token, q.size(2), window, q.dtype, q.device)
    if backend == "math":
        return math_attention(q, k, v, bias, dropout_p)
    return sdpa_attention(q, k, v, bias, dropout_p)
