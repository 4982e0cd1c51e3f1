"""Run by test_distributed.py under torchrun: train the tiny model on a prepared corpus."""

import sys
from pathlib import Path

import torch

from engine_utils import MODERN_TINY, collator, tiny_model, train_config
from minibert import Tokenizer
from minibert.data import PackedMLMDataset, TokenFile
from minibert.training.distributed import cleanup, init_distributed
from minibert.training.engine import train

if __name__ == "__main__":
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    tok = Tokenizer.from_pretrained(data / "tokenizer")
    ds = PackedMLMDataset(TokenFile.open(data / "corpus.tok", tok), seq_len=32)
    if len(sys.argv) > 3 and sys.argv[3] != "all":  # the first n examples only
        ds = torch.utils.data.Subset(ds, list(range(int(sys.argv[3]))))
    arch = MODERN_TINY if len(sys.argv) > 4 and sys.argv[4] == "modern" else {}
    ctx = init_distributed("cpu")
    model = tiny_model(tok, **arch)
    train(model, ds, collator(tok), train_config(micro_batch_size=4), out, ctx=ctx)
    if ctx.is_main:
        torch.save(model.state_dict(), out / "final.pt")
    cleanup(ctx, wait=True)
