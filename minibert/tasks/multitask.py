"""One encoder, several tasks: BERT fine-tuned on sequence and token classification at once.

    model = BertMultiTask(config, tasks={"sentiment": ("sequence", 2),
                                         "ner": ("token", ["O", "B-PER", "I-PER"])})
    out = model(input_ids, attention_mask, labels=labels, task="ner")  # TokenClassifierOutput
    model.export("ner", "final/ner", tokenizer)  # a BertForTokenClassification folder

The encoder (`bert`, with the pooler the sequence heads read) is shared, as in MT-DNN (Liu
et al. 2019): the tasks regularise one another and a small task borrows what a large one
trains. Each task's head is what the single-task class puts on the encoder (dropout, a
linear `classifier`) with that class's loss, so one task alone computes what its
single-task model computes. A batch belongs to one task (`data.sampler.TaskMixtureBatches`
draws them); `export` writes one task as an ordinary single-task folder (docs/multitask.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn
from torch import Tensor

from ..model.config import BertConfig
from ..model.heads import (BertForSequenceClassification, BertForTokenClassification,
                    SequenceClassifierOutput, TokenClassifierOutput, label_names,
                    sequence_classification_loss, token_classification_loss)
from ..machine.inputs import check_cls_first
from ..interop.hf import (PathLike, check_mappable, config_from_hf, is_modernbert,
                          load_hf_state_dict,
                 read_weights)
from ..interop.methods import GradientCheckpointing
from ..interop.pretrained import load_dtype, read_folder_config, stored_dtype
from ..model.model import BertModel, init_weights

if TYPE_CHECKING:
    from ..data.tokenizer import Tokenizer

KINDS = {"sequence": BertForSequenceClassification, "token": BertForTokenClassification}
TASK_NAME = re.compile(r"^[A-Za-z0-9_-]+$")

TaskSpec = tuple[str, Union[int, Sequence[str]]]  # (kind, number of labels or their names)


def check_task_name(name: Any) -> None:
    """A task name becomes a module name (`heads.<name>`) and an export folder: refuse one
    that cannot be either."""
    if not isinstance(name, str) or not TASK_NAME.match(name):
        raise ValueError(f"the task name {name!r} may hold only letters, digits, '_' and '-'")
    if hasattr(nn.ModuleDict(), name):
        raise ValueError(f"the task name {name!r} is taken by nn.ModuleDict, which holds the "
                         f"heads; choose another")


class TaskHead(nn.Module):
    """One task's head: dropout and a linear classifier, as in the single-task class.

    `kind` is "sequence" (reads the pooled [CLS], (B, H) -> (B, C)) or "token" (reads every
    position, (B, T, H) -> (B, T, C)). The parameter names are the single-task classes'
    (`classifier.weight`, `classifier.bias`), so `export` copies them across unchanged.
    """

    def __init__(self, config: BertConfig, kind: str, num_labels: int,
                 id2label: Optional[Sequence[str]] = None):
        super().__init__()
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"task kind {kind!r} is not one of {sorted(KINDS)}")
        # The single-task classes' rules: regression (1 label) only for sequences.
        self.id2label = label_names(num_labels, id2label, 1 if kind == "sequence" else 2)
        self.kind, self.num_labels = kind, num_labels
        self.drop = nn.Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)


class BertMultiTask(GradientCheckpointing, nn.Module):
    """A shared BERT encoder with one classification head per named task.

    tasks: {name: (kind, labels)}, kind "sequence" or "token", labels the number of classes
    or the list of their names (id2label). Names are letters, digits, "_" and "-".
    """

    # A step runs one task's head, so the others (and, for a token task, the pooler) get no
    # gradient; DDP must be told (`find_unused_parameters`), which the engine reads here.
    unused_parameters_per_step = True

    def __init__(self, config: BertConfig, tasks: Mapping[str, TaskSpec]):
        super().__init__()
        if not tasks:
            raise ValueError("BertMultiTask needs at least one task")
        if config.task_head != "bert":
            raise ValueError(f"BertMultiTask builds BERT's heads (a pooler and linear "
                             f"classifiers); task_head={config.task_head!r} is not supported "
                             f"here, use the single-task classes")
        self.config = config
        self.bert = BertModel(config, add_pooler=True)
        self.heads = nn.ModuleDict()
        for name, spec in tasks.items():
            check_task_name(name)
            if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
                raise ValueError(f"task {name!r}: expected (kind, number of labels or their "
                                 f"names), got {spec!r}")
            kind, labels = spec
            if isinstance(labels, str):
                raise ValueError(f"task {name!r}: labels must be a number or a list of names, "
                                 f"got the string {labels!r}")
            if isinstance(labels, int):
                self.heads[name] = TaskHead(config, kind, labels)
            else:
                self.heads[name] = TaskHead(config, kind, len(labels), list(labels))

    @property
    def tasks(self) -> dict[str, tuple[str, list[str]]]:
        """{name: (kind, id2label)}, in the order the tasks were given."""
        return {name: (h.kind, list(h.id2label)) for name, h in self.heads.items()}

    def _head(self, task: Any) -> TaskHead:
        if task not in self.heads:
            raise ValueError(f"unknown task {task!r}; this model's tasks are "
                             f"{list(self.heads)}")
        return self.heads[task]

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                task: Optional[str] = None, *, output_hidden_states: bool = False,
                output_attentions: bool = False
                ) -> Union[SequenceClassifierOutput, TokenClassifierOutput]:
        """input_ids, attention_mask, token_type_ids: (B, T); `task` names the head.

        A sequence task returns `SequenceClassifierOutput` (logits (B, C); labels (B,)), a
        token task `TokenClassifierOutput` (logits (B, T, C); labels (B, T) with
        IGNORE_INDEX where nothing is predicted), with the single-task classes' losses and
        the encoder's `hidden_states` and `attentions` when asked for (`BertModel.forward`).
        """
        head = self._head(task)
        if head.kind == "sequence":  # before the encoder, as the single-task classifier
            check_cls_first(attention_mask)
        out = self.bert(input_ids, attention_mask, token_type_ids,
                        output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        extras = out.hidden_states, out.attentions
        if head.kind == "sequence":
            logits = head.classifier(head.drop(out.pooler_output))  # (B, H) -> (B, C)
            loss = None if labels is None else sequence_classification_loss(logits, labels)
            return SequenceClassifierOutput(loss, logits, *extras)
        logits = head.classifier(head.drop(out.last_hidden_state))  # (B, T, H) -> (B, T, C)
        loss = None if labels is None else token_classification_loss(logits, labels,
                                                                     attention_mask)
        return TokenClassifierOutput(loss, logits, *extras)

    def single_task_model(self, task: str) -> Union[BertForSequenceClassification,
                                                    BertForTokenClassification]:
        """`task` as its single-task model, on the CPU: a copy of the shared encoder's
        weights (without the pooler for a token task, as transformers' class has none) and
        of the task's head, with its label names."""
        head = self._head(task)
        check_mappable([f"bert.{n}" for n in self.bert.state_dict()] +
                       [f"classifier.{n}" for n in head.classifier.state_dict()],
                       is_modernbert(self), f"task {task!r}'s model")
        model = KINDS[head.kind](self.config, head.num_labels, id2label=head.id2label)
        encoder = {k: t for k, t in self.bert.state_dict().items()
                   if model.bert.pooler is not None or not k.startswith("pooler.")}
        model.bert.load_state_dict(encoder)  # strict: every encoder weight is copied
        model.classifier.load_state_dict(head.classifier.state_dict())
        return model.eval()

    def export(self, task: str, path: PathLike,
               tokenizer: Optional["Tokenizer"] = None) -> Path:
        """Write `task`'s single-task model to the folder `path` with `save_pretrained`
        (config.json with id2label, weights, and `tokenizer` if given); returns `path`.

        The folder loads with `minibert.BertForSequenceClassification.from_pretrained` (or
        the token class) and, for a Post-LN model, with transformers' class of that name.
        """
        self.single_task_model(task).save_pretrained(path, tokenizer=tokenizer)
        return Path(path)

    @classmethod
    def from_pretrained(cls, path: PathLike, tasks: Mapping[str, TaskSpec], *,
                        allow_vocab_mismatch: bool = False,
                        dtype: Union[torch.dtype, str, None] = None,
                        torch_dtype: Union[torch.dtype, str, None] = None,
                        **config_overrides: Any) -> "BertMultiTask":
        """The encoder (and pooler, if stored) of a model folder, minibert's or transformers',
        with a fresh head per task: a stored head was trained for another task. The other
        arguments are the model classes' `from_pretrained`'s (`config_overrides` on top of
        the stored config, e.g. `hidden_dropout=0.0`)."""
        dtype = load_dtype(dtype, torch_dtype)
        hf_config = read_folder_config(path, allow_vocab_mismatch)
        model = cls(config_from_hf(hf_config, **config_overrides), tasks)
        weights = read_weights(path)
        load_hf_state_dict(model.bert, weights, path)
        dtype = stored_dtype(dtype, hf_config, weights)
        return model if dtype is None else model.to(dtype)

