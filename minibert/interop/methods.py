"""transformers' model methods on minibert's model classes: what a transformers user types on a
model without thinking, and what transformers' Trainer and peft call on it.

    model.device, model.dtype           where the parameters are, in which precision
    num_parameters(only_trainable=, exclude_embeddings=)
    get_input_embeddings / set_input_embeddings, get_output_embeddings / set_output_embeddings
    resize_token_embeddings(n, pad_to_multiple_of=, mean_resizing=)
    gradient_checkpointing_enable(gradient_checkpointing_kwargs=) and its newer name,
    activation_checkpointing_enable; their `_disable`s and `is_`s

Each behaves as transformers' method of the same name does on the same weights
(tests/test_model_utilities.py). One difference is by design: minibert's masked LM decodes
with the word-embedding matrix itself (`heads.MLMHead`), so its output embeddings *are* its
input embeddings, one module, where transformers ties a separate decoder `nn.Linear` to it.
No resize, swap or move can untie them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn

from ..model.config import BertConfig


class GradientCheckpointing:
    """transformers' gradient-checkpointing switch: blocks recomputed in backward, not kept
    (`BertModel._run_block`)."""

    supports_gradient_checkpointing = True

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Optional[dict] = None,
                                      *, every_n_layers: int = 1, offload: bool = False) -> None:
        """Recompute every block in the backward pass. `gradient_checkpointing_kwargs` go to
        `torch.utils.checkpoint.checkpoint` (`{"use_reentrant": False}` unless given), as in
        transformers; its `every_n_layers` and `offload` are taken at their defaults only."""
        if every_n_layers != 1 or offload:
            raise ValueError(f"every_n_layers={every_n_layers!r}, offload={offload!r}: minibert "
                             f"checkpoints every block and keeps what it saves on the model's "
                             f"device (every_n_layers=1, offload=False)")
        kwargs = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}
        self._switch_checkpointing(True, kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self._switch_checkpointing(False, {"use_reentrant": False})

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    # transformers' newer names for the same switch, which its Trainer calls first.
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: Optional[dict]
                                        = None, *, every_n_layers: int = 1,
                                        offload: bool = False) -> None:
        self.gradient_checkpointing_enable(activation_checkpointing_kwargs,
                                           every_n_layers=every_n_layers, offload=offload)

    def activation_checkpointing_disable(self) -> None:
        self.gradient_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.is_gradient_checkpointing

    def _switch_checkpointing(self, on: bool, kwargs: dict[str, Any]) -> None:
        for m in self.modules():  # every encoder in the model (BertModel's flag)
            if hasattr(m, "gradient_checkpointing"):
                m.gradient_checkpointing, m.checkpoint_kwargs = on, dict(kwargs)


class ModelMethods(GradientCheckpointing):
    """The methods of the module docstring, for a model with a `config` that is a `BertModel`
    or holds one as `bert`."""

    config: BertConfig
    # Logits over the vocabulary, decoded by the tied word embeddings: folders keep them tied.
    decodes_vocabulary: bool = False

    @property
    def device(self) -> torch.device:
        """The device of the parameters (of the first: minibert does not split a model)."""
        return next(p.device for p in self.parameters())

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the floating-point parameters (of the first)."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """The number of parameters, a tied matrix counted once; `only_trainable`: those with
        requires_grad; `exclude_embeddings`: without the embedding tables (word, position,
        segment), as transformers counts them."""
        tables = {f"{name}.weight" for name, m in self.named_modules()
                  if isinstance(m, nn.Embedding)} if exclude_embeddings else set()
        return sum(p.numel() for name, p in self.named_parameters()
                   if name not in tables and (p.requires_grad or not only_trainable))

    def _encoder(self) -> nn.Module:
        return self.bert if isinstance(getattr(self, "bert", None), nn.Module) else self

    def get_input_embeddings(self) -> nn.Embedding:
        """The word embeddings, (V, H): row i is token i."""
        return self._encoder().embeddings.word

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Swap in another (V, H) table; `resize_token_embeddings` changes V."""
        want = (self.config.vocab_size, self.config.hidden_size)
        if not isinstance(value, nn.Embedding) or tuple(value.weight.shape) != want:
            raise ValueError(f"set_input_embeddings takes an nn.Embedding of {want[0]} rows of "
                             f"{want[1]} (vocab_size, hidden_size), got {value!r}; "
                             f"resize_token_embeddings changes the number of rows")
        self._encoder().embeddings.word = value

    def get_output_embeddings(self) -> Optional[nn.Embedding]:
        """The decoder onto the vocabulary, or None for a model without one (as transformers'
        encoders and classifiers). A masked LM's is its input embeddings, the same module."""
        return self.get_input_embeddings() if self.decodes_vocabulary else None

    def set_output_embeddings(self, value: nn.Embedding) -> None:
        """A masked LM decodes with its input embeddings: setting one sets both."""
        if not self.decodes_vocabulary:
            raise TypeError(f"{type(self).__name__} has no output embeddings (it decodes no "
                            f"vocabulary)")
        self.set_input_embeddings(value)

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None,
                                pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Give the word embeddings `new_num_tokens` rows (rounded up to `pad_to_multiple_of`),
        keeping the first rows, and return them. `config.vocab_size` and a masked LM's decoder
        bias follow, and the decoder stays the embedding matrix itself.

        New rows start at the mean of the old ones with `mean_resizing` (Hewitt 2021,
        "Initializing New Word Embeddings for Pretrained Language Models": a new token then
        moves no softmax much; transformers draws around that mean with a variance 1e-9 times
        the old rows', the same within 1e-4), otherwise at BERT's initialisation,
        N(0, initializer_range). New decoder-bias entries are zero, as transformers pads a
        tied decoder's bias.
        """
        word = self.get_input_embeddings()
        n = word.num_embeddings if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
                raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a whole "
                                 f"number >= 1")
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        if n == word.num_embeddings:
            return word
        self.config.replace(vocab_size=n)  # checks n as a config would (pad_token_id < n, ...)
        word.weight = nn.Parameter(_resized(word.weight, n, mean_resizing,
                                            self.config.initializer_range),
                                   requires_grad=word.weight.requires_grad)
        word.num_embeddings = n
        if self.decodes_vocabulary:
            bias = self.head.bias  # (V,): the decoder's bias, one entry per token
            with torch.no_grad():
                new = torch.cat([bias[:n], bias.new_zeros(max(0, n - bias.size(0)))])
            self.head.bias = nn.Parameter(new, requires_grad=bias.requires_grad)
        # The encoder and the head hold the same config object: both see the new size.
        self.config.vocab_size = n
        return word


@torch.no_grad()
def _resized(rows: torch.Tensor, n: int, at_mean: bool, std: float) -> torch.Tensor:
    """(V, H) -> (n, H): the first min(V, n) rows kept, new ones at the mean of the old rows
    (`at_mean`) or drawn from N(0, std)."""
    out = rows.new_empty(n, rows.size(1))
    copied = min(n, rows.size(0))
    out[:copied] = rows[:copied]
    if at_mean:
        out[copied:] = rows.float().mean(dim=0).to(rows.dtype)
    else:
        out[copied:].normal_(0.0, std)
    return out
