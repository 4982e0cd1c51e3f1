"""The BERT encoder: embeddings, encoder blocks (Pre-LN or Post-LN) and BertModel.

Reading order: `Embeddings` -> `SelfAttention` -> `Block` (with the Pre-LN / Post-LN switch)
-> `BertModel`. (What a training step of it costs, `flops_per_token`, is in meters.py.) The modern
switches of `BertConfig` (rotary positions, GeGLU, no biases, sliding-window layers) are
branches of these same classes, so classic BERT and ModernBERT differ only where a
config field says so. The task
heads that sit on the encoder (masked LM, sequence and token classification, question
answering) are in `minibert/model/heads.py`.

Shape legend, used in every comment below and in `heads.py`:
    B   batch size              T   tokens per sequence (after padding)
    H   hidden size             nh  attention heads       hs  head size = H / nh
    I   feed-forward width      V   vocabulary size       N   number of predicted tokens
    C   classes (num_labels)

The parameters keep their own readable names (`blocks.0.attn.qkv`, ...); `minibert/interop/hf.py`
translates them to and from transformers' names, so checkpoints move both ways.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import register_pytree_node
from torch.utils.checkpoint import checkpoint

from .attention import attention, attention_bias, attention_probs
from .config import BertConfig
from ..machine.inputs import check_inputs
from ..interop.pretrained import PretrainedMixin
from .rope import apply_rope, rope_angles, rope_angles_at, rope_dtype


class ModelOutput(OrderedDict):
    """A model's named outputs, read as transformers' `ModelOutput` is read: by attribute
    (`out.logits`), by key (`out["logits"]`), and by position over the fields that are set
    (`out[0]` is the logits without labels, the loss with them; `out.to_tuple()`). A field
    left None is no key: `keys()` are the fields set, in the order they are declared.

    Each output class is a dataclass of this, its fields in transformers' order. Being a dict,
    an output iterates over its keys, as transformers' does: `loss, logits = out` unpacks
    names, not tensors; `out.to_tuple()` unpacks values.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # torch.export, DDP and other tree walkers see through a dict subclass only if it is
        # registered: its tensors are the leaves, its keys rebuild it.
        register_pytree_node(cls, lambda out: (list(out.values()), list(out.keys())),
                             lambda values, keys: cls(**dict(zip(keys, values))),
                             serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")

    def __setattr__(self, name: str, value: Any) -> None:
        if value is not None and name in self.__dataclass_fields__:
            super().__setitem__(name, value)  # a field set is a key
        super().__setattr__(name, value)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, key: Union[str, int, slice]) -> Any:
        return super().__getitem__(key) if isinstance(key, str) else self.to_tuple()[key]

    def to_tuple(self) -> tuple:
        """The values of the fields that are set, in order: transformers' `return_dict=False`."""
        return tuple(self.values())


def returned(out: ModelOutput, return_dict: Optional[bool]) -> Union[ModelOutput, tuple]:
    """What a forward hands back: `out`, or as `return_dict=False` asks, its tuple."""
    return out.to_tuple() if return_dict is False else out


@dataclass
class BertOutput(ModelOutput):
    last_hidden_state: Optional[Tensor] = None  # (B, T, H)
    pooler_output: Optional[Tensor] = None  # (B, H): tanh(W h_[CLS] + b); None without a pooler
    # Asked for by name (`output_hidden_states`, `output_attentions`), else None:
    hidden_states: Optional[tuple[Tensor, ...]] = None  # L + 1 x (B, T, H), embeddings first
    attentions: Optional[tuple[Tensor, ...]] = None  # L x (B, nh, T, T), probabilities


class Embeddings(nn.Module):
    """Token + learned absolute position + segment (token type) embeddings, then LayerNorm.

    With `position="rope"` there is no position table: positions enter every attention
    layer as rotations instead (rope.py). With `type_vocab_size=0` there are no segments.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        # padding_idx zeroes the lookup's gradient for the [PAD] row, as in the original
        # BERT; the tied MLM decoder still trains it.
        self.word = nn.Embedding(config.vocab_size, config.hidden_size,
                                 padding_idx=config.pad_token_id)
        self.position = (nn.Embedding(config.max_position_embeddings, config.hidden_size)
                         if config.position == "learned" else None)
        self.token_type = (nn.Embedding(config.type_vocab_size, config.hidden_size)
                           if config.type_vocab_size else None)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.drop = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids: Optional[Tensor], token_type_ids: Optional[Tensor],
                position_ids: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None) -> Tensor:
        """input_ids (B, T), or inputs_embeds (B, T, H): the word vectors themselves, which
        replace the lookup (soft prompts, integrated gradients); token_type_ids (or None:
        all segment 0) and position_ids (B, T) or (1, T) (or None: 0 .. T-1) -> (B, T, H)."""
        x = self.word(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, H)
        if self.position is not None:
            if position_ids is None:
                x = x + self.position.weight[:x.size(1)]  # (B, T, H) + (T, H) broadcast
            else:
                x = x + self.position(position_ids)  # (B, T, H) + (B or 1, T, H)
        if self.token_type is not None:  # no table: a model without segments (ModernBERT)
            if token_type_ids is None:  # single-segment input: every token is segment 0
                x = x + self.token_type.weight[0]
            else:
                x = x + self.token_type(token_type_ids)
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection.

    Block `layer`'s queries see every key (a global layer) or only the keys within
    `config.window(layer)` positions (a local, sliding-window layer, as in ModernBERT and
    Longformer); with `position="rope"` queries and keys are rotated by their positions:
    their columns t in the (B, T) grid, or the `positions` the caller gives. The window
    counts columns either way, as transformers' ModernBERT does.
    """

    def __init__(self, config: BertConfig, layer: int = 0):
        super().__init__()
        self.num_heads = config.num_heads
        self.backend = config.attention
        self.chunk_size = config.attention_chunk_size
        self.dropout_p = config.attention_dropout
        self.window = config.window(layer)
        self.rope_theta = config.rope_base(layer) if config.position == "rope" else None
        # One (H -> 3H) matmul instead of three (H -> H): the same math, one kernel launch.
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.bias)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)

    def forward(self, x: Tensor, is_token: Optional[Tensor], positions: Optional[Tensor] = None,
                output_attentions: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        """x: (B, T, H), or (N, H) for the N real tokens of an unpadded batch (see `unpad`);
        is_token: (B, T) bool, True for real tokens, or None when nothing is padding; positions:
        (B, T) or (1, T) integer positions for RoPE, or None for 0 .. T-1.

        Returns x's layout, and the probabilities (B, nh, T, T), zero in padding queries'
        rows, when asked for. Attention alone needs the (B, T) grid, to know which tokens
        share a sequence, so an unpadded batch goes back to it and out again.
        """
        H = x.size(-1)
        unpadded = x.dim() == 2
        qkv = self.qkv(x)  # (B, T, 3H) or (N, 3H)
        if unpadded:
            qkv = repad(qkv, is_token)  # (B, T, 3H), zeros at padding
        B, T, _ = qkv.shape
        q, k, v = qkv.split(H, dim=-1)  # 3 x (B, T, H)
        # split H into nh heads of hs dims and move heads next to batch: (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        if self.rope_theta is not None:  # rotate by position
            hs, dtype = q.size(-1), rope_dtype(q.dtype)
            if positions is None:  # t, the column in the grid: the same angles for every row
                cos, sin = rope_angles(T, hs, self.rope_theta, q.device, dtype)  # (T, hs)
            else:  # each row's own: (B or 1, T, hs) -> (B or 1, 1, T, hs), for every head
                cos, sin = (a[:, None] for a in rope_angles_at(positions, hs, self.rope_theta,
                                                               dtype))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p, probs = (self.dropout_p if self.training else 0.0), None
        if output_attentions:  # the formula itself, which has the probabilities to hand out
            probs = attention_probs(q, k, attention_bias(is_token, T, self.window, q.dtype,
                                                         q.device))  # (B, nh, T, T)
            y = F.dropout(probs, p, self.training) @ v
            if is_token is not None:  # a padding query's row is not computed by the encoder
                probs = probs.masked_fill(~is_token[:, None, :, None], 0.0)
        else:
            y = self.attend(q, k, v, is_token, p)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, H)  # heads side by side again: (B, T, H)
        if unpadded:
            y = unpad(y, is_token)  # (N, H)
        return self.out(y), probs

    def attend(self, q: Tensor, k: Tensor, v: Tensor, is_token: Optional[Tensor],
               dropout_p: float) -> Tensor:
        """(B, nh, T, hs) x3 -> (B, nh, T, hs): this layer's backend, window and tile."""
        return attention(q, k, v, is_token, self.backend, dropout_p=dropout_p,
                         chunk_size=self.chunk_size, window=self.window)


def unpad(x: Tensor, is_token: Tensor) -> Tensor:
    """(B, T, ...) -> (N, ...): the N real tokens (`is_token` True), in row-major order.

    Unpadding, as in MosaicBERT (Portes et al. 2023) and ModernBERT (Warner et al. 2024):
    every layer but attention works on each token alone (embeddings' norm, projections,
    feed-forward, LayerNorms), so a padded batch can run them on its real tokens only and
    save the work of the padding (docs/machine-room.md says what it buys). The real
    tokens' outputs are exactly the same.
    """
    return x[is_token]


def repad(x: Tensor, is_token: Tensor) -> Tensor:
    """(N, ...) -> (B, T, ...): each real token back in its (b, t) slot, zeros at padding.

    The padded positions of the encoder's output are therefore zeros, whatever the model.
    """
    full = x.new_zeros(*is_token.shape, *x.shape[1:])
    full[is_token] = x
    return full


def padded(x: Tensor, is_token: Optional[Tensor]) -> Tensor:
    """The encoder's state in the (B, T, H) layout, zeros at padding: repadded from (N, H),
    or masked where a traced graph kept the padding in place (see `BertModel.forward`)."""
    if is_token is None:
        return x
    return repad(x, is_token) if x.dim() == 2 else x.masked_fill(~is_token[..., None], 0.0)


class FeedForward(nn.Module):
    """Position-wise MLP: H -> I -> H with BERT's exact (erf) GELU, or GeGLU.

    GeGLU (Shazeer 2020, "GLU Variants Improve Transformer"; ModernBERT's MLP) gates the
    activation with a second linear map of the same input:

        FFN(x) = (GELU(x W) ∘ (x V)) W_o

    W and V are the two halves of one (H -> 2I) matrix, so the up projection is still one
    matmul. The gate lets each unit scale its own output by the input, which trains to a
    lower loss at equal parameters; with three matrices instead of two, I is usually cut to
    2/3 of BERT's to keep the parameter count (config.MODERN_PRESETS).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.gated = config.mlp == "geglu"
        width = 2 * config.intermediate_size if self.gated else config.intermediate_size
        self.up = nn.Linear(config.hidden_size, width, bias=config.bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., H) -> (..., H); the blocks pass (N, H), the real tokens (see `unpad`)."""
        if self.gated:
            a, gate = self.up(x).chunk(2, dim=-1)  # 2 x (..., I): x W and x V
            return self.down(F.gelu(a) * gate)  # (..., H)
        return self.down(F.gelu(self.up(x)))  # (..., H) -> (..., I) -> (..., H)


class Block(nn.Module):
    """One encoder layer: self-attention and feed-forward, each a residual branch."""

    def __init__(self, config: BertConfig, layer: int = 0):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = SelfAttention(config, layer)
        # ModernBERT's first block takes the embeddings' LayerNorm output as it is: a second
        # norm of an already normalised input would only rescale it.
        skip = self.pre_norm and layer == 0 and not config.first_block_attn_norm
        self.attn_norm = None if skip else _layer_norm(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = _layer_norm(config)
        self.drop = nn.Dropout(config.hidden_dropout)

    def forward(self, x: Tensor, is_token: Optional[Tensor], positions: Optional[Tensor] = None,
                output_attentions: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        """x: (N, H), the real tokens of a batch whose mask `is_token` (B, T) has padding (see
        `unpad`), or (B, T, H): a batch without padding (`is_token` None), or a traced graph's
        padded batch; positions: RoPE's (B, T) or (1, T), or None (see `SelfAttention`).
        Same shape out, and the attention probabilities when asked for."""
        if self.pre_norm:
            # Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer
            # Architecture"): normalise the input of each branch and leave the residual
            # stream untouched. The gradient then reaches every layer through the identity
            # path with the same scale, so the expected gradients near the output stay
            # bounded at initialisation and training is stable without a learning-rate
            # warmup. Post-LN puts a LayerNorm on the residual path itself; its gradients
            # at the last layers are large at initialisation, which is why original BERT
            # needs warmup and can diverge at high learning rates.
            h = x if self.attn_norm is None else self.attn_norm(x)
            a, probs = self.attn(h, is_token, positions, output_attentions)
            x = x + self.drop(a)
            x = x + self.drop(self.ffn(self.ffn_norm(x)))
        else:
            # Post-LN, the original BERT (and transformers' layout): add, then normalise.
            a, probs = self.attn(x, is_token, positions, output_attentions)
            x = self.attn_norm(x + self.drop(a))
            x = self.ffn_norm(x + self.drop(self.ffn(x)))
        return x, probs  # x: (N, H) or (B, T, H), as it came


class BertModel(PretrainedMixin, nn.Module):
    """The BERT encoder: embeddings, `num_layers` blocks and, optionally, the [CLS] pooler.

    `add_pooler` defaults to the config's heads: BERT's tanh pooler for task_head="bert",
    none for "transform" (ModernBERT has no pooler, and its folders no pooler weights)."""

    def __init__(self, config: BertConfig, add_pooler: Optional[bool] = None):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        # Pre-LN leaves the residual stream un-normalised, so the stack ends with a LayerNorm.
        self.final_norm = _layer_norm(config) if config.norm_position == "pre" else None
        if add_pooler is None:
            add_pooler = config.task_head == "bert"
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooler else None
        self.gradient_checkpointing = False  # see `_run_block`
        self.checkpoint_kwargs = {"use_reentrant": False}  # torch's `checkpoint` options
        self.apply(lambda m: init_weights(m, config))

    def forward(self, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                *, position_ids: Optional[Tensor] = None, inputs_embeds: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = False,
                output_attentions: Optional[bool] = False,
                return_dict: Optional[bool] = None) -> Union[BertOutput, tuple]:
        """input_ids, attention_mask (1 = real token, 0 = padding), token_type_ids: (B, T).
        The mask is bool, or integers or floats holding 1 and 0 alone: transformers' additive
        form (0 at a token, a large negative number at padding) is refused, not inverted.

        As in transformers, `inputs_embeds` (B, T, H) may stand for `input_ids` (one of the
        two): the word vectors themselves, to which the embeddings add positions and
        segments, then LayerNorm. `position_ids` (B, T), or (1, T) for every row, replace the
        positions 0 .. T-1: learned positions look them up, RoPE rotates by them. Both are
        keyword-only.

        Returns `last_hidden_state` (B, T, H), zero at padding positions, and
        `pooler_output` (B, H) or None. The pooler reads [CLS] at position 0, so a model with
        one refuses a batch padded on the left, as the classifiers do. As in transformers,
        `output_hidden_states` adds the L + 1 states (B, T, H): the embeddings' output, then
        each block's, the last one being `last_hidden_state` itself (after Pre-LN's final
        LayerNorm); `output_attentions` adds each block's attention probabilities
        (B, nh, T, T), computed by the plain formula (`attention.attention_probs`) whatever
        `config.attention` says. Both are zero at padding positions, like the output:
        padding is not computed. `return_dict=False` returns the fields that are set as a
        tuple, as transformers does (`ModelOutput`).
        """
        check_inputs(self.config, input_ids, attention_mask, token_type_ids,
                     pooler=self.pooler is not None, position_ids=position_ids,
                     inputs_embeds=inputs_embeds)
        is_token = None if attention_mask is None else attention_mask.bool()  # (B, T)
        # Unpadding needs N, the number of real tokens, which a graph traced by torch.compile
        # or torch.export cannot know: a traced graph keeps the padded layout, its padding
        # keys hidden by attention's bias (the same outputs). Eagerly, a mask with no padding
        # is dropped here, once for all layers: attention then gets no bias at all, which on
        # CUDA lets SDPA choose FlashAttention (any attn_mask rules it out, and MLMCollator
        # always returns one). `is_token.all()` is one host-device sync per forward, and the
        # decision whether to unpad needs the same answer anyway.
        unpadding = is_token is not None and not torch.compiler.is_compiling()
        if unpadding and bool(is_token.all()):
            is_token, unpadding = None, False
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, H)
        # Learned positions were added above; rotary ones turn queries and keys in each block.
        positions = position_ids if self.config.position == "rope" else None
        hidden = (padded(x, is_token),) if output_hidden_states else None
        attentions = () if output_attentions else None
        if unpadding:
            x = unpad(x, is_token)  # (N, H): the blocks skip the padding (see `unpad`)
        for block in self.blocks:
            x, probs = self._run_block(block, x, is_token, positions, output_attentions)
            if hidden is not None:
                hidden += (padded(x, is_token),)
            if attentions is not None:
                attentions += (probs,)
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = padded(x, is_token)  # (B, T, H)
        if hidden is not None:
            hidden = hidden[:-1] + (x,)  # the last state is the output, after the final norm
        pooled = None if self.pooler is None else torch.tanh(self.pooler(x[:, 0]))  # (B, H)
        return returned(BertOutput(x, pooled, hidden, attentions), return_dict)

    def _run_block(self, block: Block, x: Tensor, is_token: Optional[Tensor],
                   positions: Optional[Tensor],
                   output_attentions: bool) -> tuple[Tensor, Optional[Tensor]]:
        """One block, or under gradient checkpointing (Chen et al. 2016, "Training Deep Nets
        with Sublinear Memory Cost") the same block without its activations: they are
        recomputed in the backward pass, with the same random state, so the dropout masks and
        the gradients are exactly those of a plain step, and a step keeps only the blocks'
        inputs, at the price of one more forward."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(block, x, is_token, positions, output_attentions,
                              **self.checkpoint_kwargs)
        return block(x, is_token, positions, output_attentions)


def _layer_norm(config: BertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)


def init_weights(module: nn.Module, config: BertConfig) -> None:
    """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=config.initializer_range)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=config.initializer_range)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
