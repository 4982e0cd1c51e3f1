"""The BERT model: embeddings, encoder blocks, the encoder, and the MLM and classification heads.

Reading order: `Embeddings` -> `SelfAttention` -> `Block` (with the Pre-LN / Post-LN switch)
-> `BertModel` -> `BertForMaskedLM`, `BertForSequenceClassification`.

Shape legend, used in every comment below:
    B   batch size              T   tokens per sequence (after padding)
    H   hidden size             nh  attention heads       hs  head size = H / nh
    I   feed-forward width      V   vocabulary size       N   number of predicted tokens

The parameters keep their own readable names (`blocks.0.attn.qkv`, ...); `minibert/hf.py`
translates them to and from transformers' names, so checkpoints move both ways.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import attention, dropout
from .config import BertConfig
from .data.mlm import IGNORE_INDEX
from .hf import PretrainedMixin


class BertOutput(NamedTuple):
    last_hidden_state: Tensor  # (B, T, H)
    pooler_output: Optional[Tensor]  # (B, H): tanh(W h_[CLS] + b), or None without a pooler


class MaskedLMOutput(NamedTuple):
    loss: Optional[Tensor]  # scalar mean cross-entropy over predicted tokens, None without labels
    logits: Tensor  # (B, T, V) without labels; (N, V), predicted positions only, with labels


class SequenceClassifierOutput(NamedTuple):
    loss: Optional[Tensor]  # scalar, None without labels
    logits: Tensor  # (B, num_labels)


class Dropout(nn.Dropout):
    """nn.Dropout with the cheaper CPU mask of `attention.dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class Embeddings(nn.Module):
    """Token + learned absolute position + segment (token type) embeddings, then LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        # padding_idx zeroes the lookup's gradient for the [PAD] row, as in the original
        # BERT; the tied MLM decoder still trains it.
        self.word = nn.Embedding(config.vocab_size, config.hidden_size,
                                 padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.drop = Dropout(config.hidden_dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor]) -> Tensor:
        T = input_ids.size(1)
        x = self.word(input_ids) + self.position.weight[:T]  # (B, T, H) + (T, H) broadcast
        if token_type_ids is None:  # single-segment input: every token is segment 0
            x = x + self.token_type.weight[0]
        else:
            x = x + self.token_type(token_type_ids)
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.backend = config.attention
        self.chunk_size = config.attention_chunk_size
        self.dropout_p = config.attention_dropout
        # One (H -> 3H) matmul instead of three (H -> H): the same math, one kernel launch.
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: Tensor, keep: Optional[Tensor]) -> Tensor:
        """x: (B, T, H), or (N, H) for the N real tokens of an unpadded batch (see BertModel)."""
        H = x.size(-1)
        qkv = self.qkv(x)  # (B, T, 3H) or (N, 3H)
        if qkv.dim() == 2:  # unpadded: put each token back in its (b, t) slot for attention
            padded = qkv.new_zeros(*keep.shape, 3 * H)
            padded[keep] = qkv
            qkv = padded
        B, T, _ = qkv.shape
        q, k, v = qkv.split(H, dim=-1)  # 3 x (B, T, H)
        # split H into nh heads of hs dims and move heads next to batch: (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, keep, self.backend,
                      dropout_p=self.dropout_p if self.training else 0.0,
                      chunk_size=self.chunk_size)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, H)  # heads side by side again: (B, T, H)
        if x.dim() == 2:
            y = y[keep]  # (N, H)
        return self.out(y)


class FeedForward(nn.Module):
    """Position-wise MLP: H -> I -> H with BERT's exact (erf) GELU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))  # (B, T, H) -> (B, T, I) -> (B, T, H)


class Block(nn.Module):
    """One encoder layer: self-attention and feed-forward, each a residual branch."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = SelfAttention(config)
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.drop = Dropout(config.hidden_dropout)

    def forward(self, x: Tensor, keep: Optional[Tensor]) -> Tensor:
        if self.pre_norm:
            # Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer
            # Architecture"): normalise the input of each branch and leave the residual
            # stream untouched. The gradient then reaches every layer through the identity
            # path with the same scale, so the expected gradients near the output stay
            # bounded at initialisation and training is stable without a learning-rate
            # warmup. Post-LN puts a LayerNorm on the residual path itself; its gradients
            # at the last layers are large at initialisation, which is why original BERT
            # needs warmup and can diverge at high learning rates.
            x = x + self.drop(self.attn(self.attn_norm(x), keep))
            x = x + self.drop(self.ffn(self.ffn_norm(x)))
        else:
            # Post-LN, the original BERT (and transformers' layout): add, then normalise.
            x = self.attn_norm(x + self.drop(self.attn(x, keep)))
            x = self.ffn_norm(x + self.drop(self.ffn(x)))
        return x  # (B, T, H)


class BertModel(PretrainedMixin, nn.Module):
    """The BERT encoder: embeddings, `num_layers` blocks and, optionally, the [CLS] pooler."""

    def __init__(self, config: BertConfig, add_pooler: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        # Pre-LN leaves the residual stream un-normalised, so the stack ends with a LayerNorm.
        self.final_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                           if config.norm_position == "pre" else None)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooler else None
        self.apply(lambda m: init_weights(m, config))

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None) -> BertOutput:
        """input_ids, attention_mask (1 = real token, 0 = padding), token_type_ids: (B, T).

        Returns `last_hidden_state` (B, T, H), zero at padding positions, and
        `pooler_output` (B, H) or None.
        """
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        keep = None if attention_mask is None else attention_mask.bool()  # (B, T)
        # A mask with no padding in it is dropped here, once for all layers: attention then
        # gets no bias at all, which on CUDA is what lets SDPA choose the FlashAttention
        # kernel (any attn_mask rules it out, and MLMCollator always returns a mask).
        # `keep.all()` makes the host wait for the device; that is one sync per forward, and
        # the decision whether to unpad needs the same answer anyway.
        if keep is not None and bool(keep.all()):
            keep = None
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        # Unpadding (as in MosaicBERT and ModernBERT): every layer but attention works on each
        # token alone, so a padded batch runs them on its N real tokens only, (N, H), and
        # attention alone sees the (B, T) layout. With 41% padding a base training step is
        # 1.8x faster in fp32 (benchmarks/bench_unpadding.py); the real tokens' outputs are
        # unchanged, and padding positions come out as zeros.
        unpad = keep is not None
        if unpad:
            x = x[keep]  # (N, H)
        for block in self.blocks:
            x = block(x, keep)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if unpad:
            full = x.new_zeros(*keep.shape, x.size(-1))
            full[keep] = x
            x = full  # (B, T, H)
        pooled = None if self.pooler is None else torch.tanh(self.pooler(x[:, 0]))  # (B, H)
        return BertOutput(x, pooled)


class MLMHead(nn.Module):
    """Transform (dense, GELU, LayerNorm), then the decoder tied to the word embeddings."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        """h: (..., H), word_embeddings: (V, H) -> logits (..., V)."""
        h = self.norm(F.gelu(self.dense(h)))
        # The decoder *is* the input embedding matrix (weight tying, Press & Wolf 2017): it
        # saves V x H parameters, and since there is only one tensor there is nothing to
        # re-tie after loading, moving or compiling the model.
        return F.linear(h, word_embeddings, self.bias)


class BertForMaskedLM(PretrainedMixin, nn.Module):
    """BERT with the masked-language-modelling head (no pooler, as in transformers)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.head = MLMHead(config)
        self.head.apply(lambda m: init_weights(m, config))

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None) -> MaskedLMOutput:
        """labels: (B, T), the original token id where one is predicted and IGNORE_INDEX (-100)
        elsewhere.

        Without labels, `logits` is (B, T, V). With labels the head runs *only* on the N
        predicted positions (sparse prediction, as in Cramming and academic-budget-bert):
        with 15% masking that skips 85% of the largest matmul and of the vocabulary-wide
        softmax. `logits` is then (N, V), in the row-major order of `labels != IGNORE_INDEX`, and
        `loss` is the mean cross-entropy over those N tokens (NaN when N == 0, as in torch).
        """
        h = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        decoder = self.bert.embeddings.word.weight  # (V, H), tied
        if labels is None:
            return MaskedLMOutput(None, self.head(h, decoder))
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels has shape {tuple(labels.shape)} but input_ids has "
                             f"{tuple(input_ids.shape)}; they must match")
        predicted = labels != IGNORE_INDEX  # (B, T) bool
        logits = self.head(h[predicted], decoder)  # (N, H) -> (N, V)
        loss = F.cross_entropy(logits.float(), labels[predicted])
        return MaskedLMOutput(loss, logits)


class BertForSequenceClassification(PretrainedMixin, nn.Module):
    """BERT with a classifier on the pooled [CLS] vector.

    `num_labels == 1` is regression (MSE on float labels); otherwise cross-entropy on class ids.
    `id2label` names the classes (default LABEL_0, LABEL_1, ...); it is saved in config.json.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2,
                 id2label: Optional[Sequence[str]] = None):
        super().__init__()
        if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
            raise ValueError(f"num_labels={num_labels!r} must be an integer >= 1 "
                             f"(1 means regression)")
        # The class names, saved as id2label / label2id in config.json so that predictions can
        # be read back as names (by minibert and by transformers).
        names = [f"LABEL_{i}" for i in range(num_labels)] if id2label is None else \
            [str(n) for n in id2label]
        if len(names) != num_labels or len(set(names)) != num_labels:
            raise ValueError(f"id2label must hold num_labels={num_labels} distinct names, got "
                             f"{names!r}")
        self.config = config
        self.num_labels = num_labels
        self.id2label = names
        self.bert = BertModel(config, add_pooler=True)
        self.drop = Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

    @classmethod
    def _init_kwargs(cls, hf_config: dict, overrides: dict) -> dict:
        # An explicit num_labels / id2label wins, else the checkpoint's label map, else 2
        # classes. The stored names are kept only when their number matches.
        stored = hf_config.get("id2label") or {}
        stored = [str(stored[k]) for k in sorted(stored, key=int)]
        id2label = overrides.pop("id2label", None)
        num_labels = overrides.pop("num_labels", None) or len(id2label or stored) or 2
        if id2label is None and len(stored) == num_labels:
            id2label = stored
        return {"num_labels": num_labels, "id2label": id2label}

    def _hf_config_extras(self) -> dict:
        # transformers derives num_labels from the label map.
        return {"id2label": {str(i): name for i, name in enumerate(self.id2label)},
                "label2id": {name: i for i, name in enumerate(self.id2label)}}

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None) -> SequenceClassifierOutput:
        """labels: (B,) class ids (long), or floats when num_labels == 1.

        logits: (B, num_labels).
        """
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output  # (B, H)
        logits = self.classifier(self.drop(pooled))  # (B, num_labels)
        if labels is None:
            return SequenceClassifierOutput(None, logits)
        if labels.shape != (input_ids.size(0),):
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected "
                             f"({input_ids.size(0)},), one label per sequence")
        if self.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
        else:
            if labels.is_floating_point():
                raise TypeError("labels must be integer class ids for classification "
                                f"(num_labels={self.num_labels}); got {labels.dtype}")
            loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss, logits)


def init_weights(module: nn.Module, config: BertConfig) -> None:
    """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=config.initializer_range)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=config.initializer_range)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def check_inputs(config: BertConfig, input_ids: Tensor, attention_mask: Optional[Tensor],
                 token_type_ids: Optional[Tensor]) -> None:
    """Turn the usual input mistakes into clear errors, once per forward (not per layer).

    The only costly check is the token-id range, one fused min/max reduction over (B, T);
    without it a bad id surfaces as an IndexError inside nn.Embedding (or, on CUDA, as a
    device-side assert that poisons the whole process).
    """
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids)}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids (torch.long), got "
                        f"{input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, tokens), got shape "
                         f"{tuple(input_ids.shape)}; for one sequence use input_ids[None]")
    B, T = input_ids.shape
    if B == 0 or T == 0:  # would otherwise fail deep inside attention, in a reshape
        raise ValueError(f"input_ids is empty, shape {(B, T)}; the model needs at least one "
                         f"sequence of at least one token")
    if T > config.max_position_embeddings:
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings="
                         f"{config.max_position_embeddings}; truncate the input or build the "
                         f"model with a larger max_position_embeddings")
    lo, hi = torch.aminmax(input_ids)
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(f"input_ids must lie in [0, vocab_size={config.vocab_size}), found "
                         f"values from {int(lo)} to {int(hi)}; does the tokenizer match the "
                         f"model?")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and (not isinstance(t, Tensor) or t.shape != input_ids.shape):
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} has shape {shape} but input_ids has {(B, T)}; they must "
                             f"match")
    if token_type_ids is not None and token_type_ids.numel() > 0:
        lo, hi = torch.aminmax(token_type_ids)
        if lo < 0 or hi >= config.type_vocab_size:
            raise ValueError(f"token_type_ids must lie in [0, type_vocab_size="
                             f"{config.type_vocab_size}), found values from {int(lo)} to "
                             f"{int(hi)}")
