"""The loop engine.py shows is the loop `train()` runs: the steps of its block written out by
hand, in a plain nanoGPT-style loop of a dozen lines with nothing of the engine around them,
give the weights `train()` gives, bit for bit."""

import copy

import pytest
import torch

from engine_utils import collator, tiny_corpus, tiny_model, train_config
from minibert.data import GlobalBatches
from minibert.labels import count_targets
from minibert.training.engine import micro_step_weight, train
from minibert.training.optim import build_optimizer, lr_at, resolve_warmup


@pytest.mark.parametrize("micro_batch_size", [16, 4])
def test_the_step_engine_py_shows_gives_trains_weights_bit_for_bit(tmp_path, micro_batch_size):
    tok, dataset = tiny_corpus(tmp_path)
    collate = collator(tok)
    cfg = train_config(max_steps=5, warmup=2, micro_batch_size=micro_batch_size)
    model = tiny_model(tok, dropout=0.1)  # dropout on: the same random draws, in order
    by_hand = copy.deepcopy(model)

    torch.manual_seed(1)
    train(model, dataset, collate, cfg, tmp_path / "run")

    torch.manual_seed(1)
    by_hand.train()
    optimizer = build_optimizer(by_hand, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    batches = GlobalBatches(len(dataset), cfg.batch_size, seed=cfg.seed)
    for step in range(1, cfg.max_steps + 1):
        epoch, indices = batches.next()  # 1-2: the batch, its micro-batches and targets
        examples = [dataset[i] for i in indices]
        micros = [collate(examples[i:i + micro_batch_size], epoch=epoch)
                  for i in range(0, len(examples), micro_batch_size)]
        counts = [count_targets(b) for b in micros]
        for group in optimizer.param_groups:  # warmup, then decay
            group["lr"] = lr_at(step, max_lr=cfg.lr, min_lr=cfg.min_lr,
                                warmup_steps=resolve_warmup(cfg.warmup, cfg.max_steps),
                                total_steps=cfg.max_steps, schedule=cfg.schedule)
        for batch, n in zip(micros, counts):  # 3: forward and backward, weighted
            (by_hand(**batch).loss * micro_step_weight(n, sum(counts), 1)).backward()
        torch.nn.utils.clip_grad_norm_(by_hand.parameters(), cfg.max_grad_norm)  # 4
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    trained, hand = model.state_dict(), by_hand.state_dict()
    assert all(torch.equal(trained[k], hand[k]) for k in trained)
    assert not torch.equal(trained["bert.embeddings.word.weight"],
                           tiny_model(tok, dropout=0.1).state_dict()["bert.embeddings.word.weight"])
