"""Knowledge distillation for masked-language modelling (Hinton et al. 2015; DistilBERT, Sanh
et al. 2019): the loss, and `Distiller`, a student and a frozen teacher in one module with
`BertForMaskedLM`'s forward, which `engine.train` trains unchanged (docs/distill.md).

    loss = alpha * T^2 * KL(p_teacher^T || p_student^T) + (1 - alpha) * CE(student, labels)
"""

from __future__ import annotations

import hashlib
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..atomic import PathLike
from ..labels import predicted
from ..model.heads import BertForMaskedLM, MaskedLMOutput
from ..interop.hf import config_from_hf, read_config
from ..interop.pretrained import check_tokenizer_fits
from ..data.tokenizer import Tokenizer


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, targets: Tensor,
                      alpha: float, temperature: float) -> Tensor:
    """alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE, each
    a mean over the N tokens. student_logits, teacher_logits: (N, V); targets: (N,).

    Why T^2 (Hinton et al. 2015, section 2): the softened KL's gradient is (p_student^T -
    p_teacher^T) / T, with gaps of O(1/T), so it shrinks as 1/T^2; T^2 keeps the soft term's
    weight the same whatever T. In fp32: bf16 is too coarse for a log-softmax over V.
    """
    student_logits, teacher_logits = student_logits.float(), teacher_logits.float()
    hard = F.cross_entropy(student_logits, targets)
    log_p_student = F.log_softmax(student_logits / temperature, dim=-1)  # (N, V)
    log_p_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)  # (N, V)
    # kl_div(input, target) is KL(target || input); "batchmean" sums over V and divides by N.
    soft = F.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean")
    return alpha * temperature ** 2 * soft + (1.0 - alpha) * hard


class Distiller(nn.Module):
    """The student plus a frozen teacher, as one model that `training.engine.train` drives.
    Only the student is a submodule, so the optimizer, checkpoints and `train()` see it
    alone; the teacher is a plain attribute, in eval mode (deterministic targets)."""

    def __init__(self, student: BertForMaskedLM, teacher: BertForMaskedLM,
                 alpha: float = 0.5, temperature: float = 2.0):
        super().__init__()
        check_alpha_temperature(alpha, temperature)
        if student.config.vocab_size != teacher.config.vocab_size:
            raise ValueError(f"the student has {student.config.vocab_size} output tokens and "
                             f"the teacher {teacher.config.vocab_size}: distillation compares "
                             f"their distributions token by token, so they must share one "
                             f"vocabulary")
        self.student = student
        self.config = student.config
        self.alpha, self.temperature = float(alpha), float(temperature)
        teacher.eval().requires_grad_(False)
        # object.__setattr__ bypasses nn.Module's registration of submodules.
        object.__setattr__(self, "teacher", teacher)

    def to(self, *args, **kwargs) -> "Distiller":
        self.teacher.to(*args, **kwargs)  # not a registered submodule, so moved by hand
        return super().to(*args, **kwargs)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None) -> MaskedLMOutput:
        """Inputs (B, T) as `BertForMaskedLM`'s. With labels: the distillation loss and the
        student's (N, V) logits; without: the student's output."""
        student = self.student(input_ids, attention_mask, token_type_ids, labels)
        if labels is None:
            return student
        with torch.no_grad():
            # Same labels, so the same N positions in the same (row-major) order.
            teacher_logits = self.teacher(input_ids, attention_mask, token_type_ids,
                                          labels).logits  # (N, V)
        targets = labels[predicted(labels, attention_mask)]  # (N,), as the heads select them
        loss = distillation_loss(student.logits, teacher_logits, targets, self.alpha,
                                 self.temperature)
        return MaskedLMOutput(loss, student.logits)


def check_alpha_temperature(alpha: float, temperature: float) -> None:
    if not 0.0 <= alpha <= 1.0:  # also refuses NaN
        raise ValueError(f"--alpha {alpha} must lie in [0, 1] (1 = the teacher's soft targets "
                         f"only, 0 = the hard MLM labels only)")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"--temperature {temperature} must be a finite number > 0 (1 = the "
                         f"teacher's own distribution; Hinton et al. use 1 to 20)")


def load_teacher(path: PathLike, seq_len: int, allow_vocab_mismatch: bool = False,
                 what: str = "the teacher") -> tuple[BertForMaskedLM, Tokenizer]:
    """The teacher of folder `path` and its tokenizer, refused before its weights are read
    when it cannot teach: a classifier (its MLM head would be random), a tokenizer that is
    not its own (`check_tokenizer_fits`), or fewer positions than `seq_len` (`what` names it)."""
    stored = read_config(path)
    architectures = stored.get("architectures") or []
    if architectures and not any(a.endswith(("ForMaskedLM", "ForPreTraining"))
                                 for a in architectures):
        raise ValueError(f"the teacher {path} is a {', '.join(architectures)}, not a "
                         f"masked-language model: it has no MLM head to distil from (one "
                         f"would be initialised at random); pass a *ForMaskedLM checkpoint")
    tok = Tokenizer.from_pretrained(path)
    config = config_from_hf(stored)
    config.check_fits(seq_len, tok.vocab_size, what=what)
    check_tokenizer_fits(config, tok, source=path, what="the teacher",
                         allow_vocab_mismatch=allow_vocab_mismatch)
    # Checked just above: the loader's own check of the folder's vocabulary is waived.
    return BertForMaskedLM.from_pretrained(path, allow_vocab_mismatch=True), tok


def teacher_digest(teacher: nn.Module) -> str:
    """A hash of the teacher's weights: a resumed run must distil from the same teacher."""
    h = hashlib.blake2b(digest_size=8)
    for name, t in sorted(teacher.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
