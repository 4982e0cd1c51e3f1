"""Task heads on the BERT encoder: masked LM, sequence and token classification, QA.

Each head is a `BertModel` plus a few parameters, and returns an output whose fields carry
transformers' names (`loss`, `logits`, `start_logits`, ...) and read as transformers' do
(`model.ModelOutput`: `out.logits`, `out["logits"]`, `out[0]` over the fields that are set):

    BertForMaskedLM                 tied decoder onto the vocabulary, run on predicted rows only
    BertForSequenceClassification   one linear layer on the pooled [CLS] vector
    BertForTokenClassification      one linear layer on every position's vector
    BertForQuestionAnswering        two scores per position: answer start and answer end

The multi-task model (one encoder, a classifier per task) is `multitask.BertMultiTask`; it
shares the classifiers' loss functions below. Their parameter names map onto transformers'
classes of the same names (`minibert/interop/hf.py`), so each head loads from and saves to
transformers' checkpoints. Shapes follow the legend of `model.py` (B, T, H, V, N, C).
Each forward takes the encoder's arguments and hands them on (`BertModel.forward`): the
batch as `input_ids` or as `inputs_embeds`, `attention_mask`, `token_type_ids`,
`position_ids`, the two `output_*` flags and `return_dict`; then its own targets.

Padding never enters a loss: the encoder leaves padding positions at zero, so their logits
are only the bias. Masked LM and token classification ignore labels placed there; question answering
gives padding a logit of the dtype's minimum, so the softmax over positions runs on the
sequence's own tokens. On a batch without padding the losses are transformers' exactly.
Padding goes on the right: a sequence classifier reads [CLS] at position 0, and refuses a
batch where that position is padding (`check_cls_first`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import BertConfig
from ..machine.inputs import check_cls_first, check_ids, check_range, check_shape
from ..labels import IGNORE_INDEX, predicted
from ..interop.pretrained import PretrainedMixin, default_labels, stored_labels
from .model import BertModel, ModelOutput, init_weights, returned


@dataclass
class MaskedLMOutput(ModelOutput):
    loss: Optional[Tensor] = None  # scalar mean cross-entropy over predicted tokens, with labels
    logits: Optional[Tensor] = None  # (B, T, V); with labels (N, V), the predicted rows
    hidden_states: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for
    attentions: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for


@dataclass
class SequenceClassifierOutput(ModelOutput):
    loss: Optional[Tensor] = None  # scalar, with labels
    logits: Optional[Tensor] = None  # (B, C)
    hidden_states: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for
    attentions: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for


@dataclass
class TokenClassifierOutput(ModelOutput):
    loss: Optional[Tensor] = None  # scalar mean cross-entropy over labelled real tokens
    logits: Optional[Tensor] = None  # (B, T, C)
    hidden_states: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for
    attentions: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for


@dataclass
class QuestionAnsweringModelOutput(ModelOutput):
    loss: Optional[Tensor] = None  # scalar (start loss + end loss) / 2, with positions
    start_logits: Optional[Tensor] = None  # (B, T), the dtype's minimum at padding
    end_logits: Optional[Tensor] = None  # (B, T), the dtype's minimum at padding
    hidden_states: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for
    attentions: Optional[tuple[Tensor, ...]] = None  # as BertOutput's, when asked for


# ---- masked language modelling ---------------------------------------------------------------

class Transform(nn.Module):
    """Dense, GELU, LayerNorm: (..., H) -> (..., H). The first half of BERT's MLM head, and
    with `task_head="transform"` (ModernBERT's heads) the layer before every classifier: it
    replaces BERT's tanh pooler for sequences and adds a layer before the token and span
    classifiers."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.norm(F.gelu(self.dense(h)))


class MLMHead(Transform):
    """The transform (dense, GELU, LayerNorm), then the decoder tied to the word embeddings.

    The decoder keeps its bias when `config.bias` is off, as ModernBERT's does."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        """h: (..., H), word_embeddings: (V, H) -> logits (..., V)."""
        # The decoder *is* the input embedding matrix (weight tying, Press & Wolf 2017): it
        # saves V x H parameters, and since there is only one tensor there is nothing to
        # re-tie after loading, moving or compiling the model.
        return F.linear(super().forward(h), word_embeddings, self.bias)

    def predict(self, h: Tensor, word_embeddings: Tensor,
                targets: Tensor) -> tuple[Tensor, Tensor]:
        """The predicted rows h (N, H) and their token ids (N,) -> logits (N, V) and their
        mean cross-entropy, computed in fp32 as every loss here."""
        logits = self(h, word_embeddings)
        return logits, F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)


class BertForMaskedLM(PretrainedMixin, nn.Module):
    """BERT with the masked-language-modelling head (no pooler, as in transformers)."""

    decodes_vocabulary = True  # the head's decoder is the word-embedding matrix

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.head = MLMHead(config)
        self.head.apply(lambda m: init_weights(m, config))

    def forward(self, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, *, position_ids: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = False,
                output_attentions: Optional[bool] = False,
                return_dict: Optional[bool] = None) -> Union[MaskedLMOutput, tuple]:
        """labels: (B, T), the original token id where one is predicted and IGNORE_INDEX (-100)
        elsewhere.

        Without labels, `logits` is (B, T, V). With labels the head runs *only* on the N
        predicted positions (sparse prediction, as in Cramming and academic-budget-bert):
        with 15% masking that skips 85% of the largest matmul and of the vocabulary-wide
        softmax. `logits` is then (N, V), in the row-major order of the labelled real tokens
        (a label on padding is ignored), and `loss` is the mean cross-entropy over those N
        tokens (NaN when N == 0, as in torch).
        """
        decoder = self.bert.embeddings.word.weight  # (V, H), tied
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids=position_ids,
                        inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        h, extras = out.last_hidden_state, (out.hidden_states, out.attentions)  # h: (B, T, H)
        if labels is None:
            return returned(MaskedLMOutput(None, self.head(h, decoder), *extras), return_dict)
        check_shape("labels", labels, tuple(h.shape[:2]), "the batch's (B, T)")
        check_ids("labels", labels, "token ids to predict (IGNORE_INDEX elsewhere)")
        targeted = predicted(labels, attention_mask)  # (B, T) bool: labelled real tokens
        h, targets = h[targeted], labels[targeted]  # (N, H), (N,)
        check_range("labels", targets, decoder.size(0), "vocabulary")  # N ids, not B x T
        logits, loss = self.head.predict(h, decoder, targets)  # (N, V), scalar
        return returned(MaskedLMOutput(loss, logits, *extras), return_dict)


# ---- classification: one label per sequence or per token -------------------------------------

def _transform(config: BertConfig) -> Optional[Transform]:
    if config.task_head != "transform":
        return None
    head = Transform(config)
    head.apply(lambda m: init_weights(m, config))
    return head


def pool(h: Tensor, attention_mask: Optional[Tensor], how: str) -> Tensor:
    """(B, T, H) -> (B, H): the [CLS] vector, or the mean over real tokens."""
    if how == "cls":  # the callers have refused a padded position 0 (`check_cls_first`)
        return h[:, 0]
    if attention_mask is None:
        return h.mean(dim=1)
    m = attention_mask.to(h.dtype)[..., None]  # (B, T, 1)
    return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)  # a row of padding alone: zeros

class Labelled(PretrainedMixin):
    """The class names of a classifier, saved as id2label / label2id in config.json so that
    predictions read back as names, in minibert and in transformers."""

    num_labels: int
    id2label: list[str]

    def _set_labels(self, num_labels: int, id2label: Optional[Sequence[str]],
                    minimum: int) -> None:
        self.id2label = label_names(num_labels, id2label, minimum)
        self.num_labels = num_labels

    @classmethod
    def _init_kwargs(cls, hf_config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
        # An explicit num_labels / id2label wins, else the checkpoint's classes
        # (`stored_labels`). The stored names are kept only when their number matches.
        stored = stored_labels(hf_config)
        id2label = overrides.pop("id2label", None)
        num_labels = overrides.pop("num_labels", None) or len(id2label or stored)
        if id2label is None and len(stored) == num_labels:
            id2label = stored
        return {"num_labels": num_labels, "id2label": id2label}

    def _hf_config_extras(self) -> dict[str, Any]:
        # transformers derives num_labels from the label map.
        return {"id2label": {str(i): name for i, name in enumerate(self.id2label)},
                "label2id": {name: i for i, name in enumerate(self.id2label)}}


class BertForSequenceClassification(Labelled, nn.Module):
    """BERT with a classifier on the pooled [CLS] vector.

    `num_labels == 1` is regression (MSE on float labels); otherwise cross-entropy on class ids.
    `id2label` names the classes (default LABEL_0, LABEL_1, ...); it is saved in config.json.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2,
                 id2label: Optional[Sequence[str]] = None):
        super().__init__()
        self._set_labels(num_labels, id2label, minimum=1)
        self.config = config
        self.head = _transform(config)  # None: BERT's pooler reads [CLS] instead
        self.bert = BertModel(config, add_pooler=self.head is None)
        self.drop = nn.Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

    def forward(self, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, *, position_ids: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = False,
                output_attentions: Optional[bool] = False,
                return_dict: Optional[bool] = None) -> Union[SequenceClassifierOutput, tuple]:
        """labels: (B,) class ids (long), or floats when num_labels == 1.

        logits: (B, C).
        """
        if self.head is None or self.config.classifier_pooling == "cls":
            # Before the encoder: on a GPU the host then waits for nothing queued by it.
            check_cls_first(attention_mask)
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids=position_ids,
                        inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        extras = out.hidden_states, out.attentions
        if self.head is None:
            pooled = out.pooler_output  # (B, H): tanh(W h_[CLS] + b)
        else:
            pooled = self.head(pool(out.last_hidden_state, attention_mask,
                                    self.config.classifier_pooling))  # (B, H)
        logits = self.classifier(self.drop(pooled))  # (B, C)
        loss = None if labels is None else sequence_classification_loss(logits, labels)
        return returned(SequenceClassifierOutput(loss, logits, *extras), return_dict)


class BertForTokenClassification(Labelled, nn.Module):
    """BERT with a classifier on every position (NER, POS tagging); no pooler, as in
    transformers.

    A word split into several pieces is labelled on its first piece, and its other pieces
    carry IGNORE_INDEX (`data.tasks.encode_token_classification` does this, and
    `data.tasks.word_predictions` reads each word back from its first piece).
    """

    def __init__(self, config: BertConfig, num_labels: int,
                 id2label: Optional[Sequence[str]] = None):
        super().__init__()
        self._set_labels(num_labels, id2label, minimum=2)
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.head = _transform(config)
        self.drop = nn.Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

    def forward(self, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, *, position_ids: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = False,
                output_attentions: Optional[bool] = False,
                return_dict: Optional[bool] = None) -> Union[TokenClassifierOutput, tuple]:
        """labels: (B, T) class ids, IGNORE_INDEX (-100) where no label is predicted.

        logits: (B, T, C). `loss` is the mean cross-entropy over the positions that carry a
        label (NaN when none does, as in torch); a label on padding is ignored.
        """
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids=position_ids,
                        inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        h, extras = out.last_hidden_state, (out.hidden_states, out.attentions)  # h: (B, T, H)
        if self.head is not None:
            h = self.head(h)
        logits = self.classifier(self.drop(h))  # (B, T, C)
        loss = None if labels is None else \
            token_classification_loss(logits, labels, attention_mask)
        return returned(TokenClassifierOutput(loss, logits, *extras), return_dict)


def label_names(num_labels: int, id2label: Optional[Sequence[str]], minimum: int) -> list[str]:
    """The checked class names of a classifier with `num_labels` classes (LABEL_i by default).

    `minimum` is 1 for sequence classification (1 means regression), 2 for token labels.
    """
    if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < minimum:
        raise ValueError(f"num_labels={num_labels!r} must be an integer >= {minimum}"
                         + (" (1 means regression)" if minimum == 1 else ""))
    names = default_labels(num_labels) if id2label is None else \
        [str(n) for n in id2label]
    if len(names) != num_labels or len(set(names)) != num_labels:
        raise ValueError(f"id2label must hold num_labels={num_labels} distinct names, got "
                         f"{names!r}")
    return names


# The two classifiers' losses, shared with the multi-task model (multitask.py), whose heads
# must train exactly as the single-task classes do.

def sequence_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """logits (B, C), labels (B,): MSE on float labels when C == 1 (regression), otherwise
    cross-entropy on class ids. Computed in float32 whatever the autocast dtype."""
    num_labels = logits.size(-1)
    check_shape("labels", labels, (logits.size(0),), "one label per sequence (multi-label "
                 "targets, a column per class, are not supported)")
    if num_labels == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    check_ids("labels", labels, f"integer class ids for classification (num_labels="
                                  f"{num_labels})")
    check_range("labels", labels, num_labels, f"{num_labels} classes")
    return F.cross_entropy(logits.float(), labels)


def token_classification_loss(logits: Tensor, labels: Tensor,
                              attention_mask: Optional[Tensor]) -> Tensor:
    """logits (B, T, C), labels (B, T) with IGNORE_INDEX where nothing is predicted: the mean
    cross-entropy over labelled real tokens (a label on padding is ignored)."""
    check_shape("labels", labels, tuple(logits.shape[:2]), "the shape of input_ids")
    check_ids("labels", labels, "integer class ids for token classification")
    check_range("labels", labels, logits.size(-1), f"{logits.size(-1)} classes")
    if attention_mask is not None:  # the encoder did not compute padding: never score it
        labels = labels.masked_fill(~attention_mask.bool(), IGNORE_INDEX)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           ignore_index=IGNORE_INDEX)  # (B*T, C) against (B*T,)


# ---- extractive question answering -----------------------------------------------------------

class BertForQuestionAnswering(PretrainedMixin, nn.Module):
    """BERT scoring every position as the start and as the end of the answer span (Devlin
    et al. 2019, section 4.2): one linear layer H -> 2, no pooler and no dropout, as in
    transformers. `data.qa` makes the training positions and finds the best span."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.head = _transform(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # transformers' name and layout
        init_weights(self.qa_outputs, config)

    def forward(self, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                start_positions: Optional[Tensor] = None,
                end_positions: Optional[Tensor] = None, *, position_ids: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = False,
                output_attentions: Optional[bool] = False,
                return_dict: Optional[bool] = None) -> Union[QuestionAnsweringModelOutput, tuple]:
        """start_positions, end_positions: (B,) token indices of the answer's first and last
        token (0, the [CLS], for "no answer here").

        start_logits, end_logits: (B, T), the dtype's minimum at padding. As in
        transformers, positions are clamped to [0, T] and T is ignored: a position past the
        end drops out of its loss term (start and end separately), and a negative one means
        [CLS]. A position on padding lies outside the sequence too and is ignored likewise.
        `loss` is (mean start cross-entropy + mean end cross-entropy) / 2.
        """
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids=position_ids,
                        inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        h, extras = out.last_hidden_state, (out.hidden_states, out.attentions)  # h: (B, T, H)
        if self.head is not None:
            h = self.head(h)
        start_logits, end_logits = self.qa_outputs(h).unbind(-1)  # (B, T, 2) -> 2 x (B, T)
        is_token = None if attention_mask is None else attention_mask.bool()  # (B, T)
        if is_token is not None:  # the softmax over positions must not see padding
            low = torch.finfo(start_logits.dtype).min
            start_logits = start_logits.masked_fill(~is_token, low)
            end_logits = end_logits.masked_fill(~is_token, low)
        if start_positions is None and end_positions is None:
            return returned(QuestionAnsweringModelOutput(None, start_logits, end_logits, *extras),
                            return_dict)
        if start_positions is None or end_positions is None:
            raise ValueError("pass both start_positions and end_positions for a loss, or "
                             "neither")
        B, T = start_logits.shape
        losses = []
        for name, positions, logits in (("start_positions", start_positions, start_logits),
                                        ("end_positions", end_positions, end_logits)):
            check_shape(name, positions, (B,), "one position per sequence")
            check_ids(name, positions, "integer token positions")
            target = _span_target(positions, is_token, T)
            losses.append(F.cross_entropy(logits.float(), target, ignore_index=T))
        loss = (losses[0] + losses[1]) / 2
        return returned(QuestionAnsweringModelOutput(loss, start_logits, end_logits, *extras),
                        return_dict)


def _span_target(positions: Tensor, is_token: Optional[Tensor], T: int) -> Tensor:
    """(B,) positions -> (B,) targets in [0, T], where T means "ignore"."""
    target = positions.clamp(0, T)  # transformers' rule: past the end -> T, ignored
    if is_token is not None:
        # Column T stands for "past the end" and stays ignored; a target on padding joins it.
        real = torch.cat([is_token, is_token.new_ones(is_token.size(0), 1)], dim=1)  # (B, T + 1)
        on_real = real.gather(1, target[:, None]).squeeze(1)  # (B,)
        target = target.masked_fill(~on_real, T)
    return target
