"""CUDA-only paths: skipped on machines without a GPU, run by benchmarks/gpu_check.sh."""


import dataclasses

import pytest
import torch

import minibert
from conftest import random_batch, tiny_config
from facts import raises

from minibert.model.attention import attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_fp16_training_with_grad_scaler(tmp_path):
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.training.engine import train

    tok, ds = tiny_corpus(tmp_path)
    result = train(tiny_model(tok), ds, collator(tok), train_config(precision="fp16"),
                   tmp_path / "run", ctx=_cuda_ctx())
    assert result["precision"] == "fp16"
    losses = [r["loss"] for r in _rows(tmp_path / "run")]
    assert losses[-1] < losses[0]


def test_fp16_skips_a_nan_step_through_the_real_grad_scaler(tmp_path):
    """fp16 with a real GradScaler and a NaN loss at step 3: that step changes no weight, the
    run goes on to the end (no "unscale_() has already been called"), and the scale halved once
    for every skipped step, the NaN one and any overflow while the scale calibrated."""
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.training.checkpoint import latest_checkpoint, load_checkpoint
    from minibert.training.engine import train

    tok, ds = tiny_corpus(tmp_path)
    model = tiny_model(tok).cuda()
    forward, seen = model.forward, []

    def nan_on_the_third_call(*args, **kwargs):
        seen.append([p.detach().clone() for p in model.parameters()])
        out = forward(*args, **kwargs)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if len(seen) == 3 else out

    model.forward = nan_on_the_third_call
    result = train(model, ds, collator(tok), train_config(precision="fp16", max_steps=8),
                   tmp_path / "run", ctx=_cuda_ctx())
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 9)) and len(seen) == 8
    # NaN, written as JSON's null (training/runlog.py)
    assert rows[2]["loss"] is None and rows[2]["skipped"] > rows[1]["skipped"]
    assert all(torch.equal(p, q) for p, q in zip(seen[2], seen[3]))  # step 3 changed nothing
    # and training went on after it (a step may still overflow while the scale calibrates)
    assert not all(torch.equal(p, q) for p, q in zip(seen[3], model.parameters()))
    scaler = load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"))["scaler"]
    assert scaler["scale"] == 65536.0 / 2 ** result["skipped_steps"]


def test_bf16_is_the_default_on_cuda(tmp_path):
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.training.engine import train

    tok, ds = tiny_corpus(tmp_path)
    result = train(tiny_model(tok), ds, collator(tok),
                   train_config(max_steps=2, precision="auto"), tmp_path / "run", ctx=_cuda_ctx())
    assert result["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def test_peak_memory_tracks_cuda_allocations():
    from minibert.machine.memory import current_memory_mb, peak_memory_mb, reset_peak_memory

    reset_peak_memory("cuda")
    base = current_memory_mb("cuda")
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    assert peak_memory_mb("cuda") - base >= 255
    del x
    reset_peak_memory("cuda")
    assert peak_memory_mb("cuda") - base < 1


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_backends_agree_on_cuda(backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=g).cuda().requires_grad_() for _ in range(3))
    keep = torch.ones(2, 300, dtype=torch.bool, device="cuda")
    keep[1, 200:] = False
    ref = attention(q, k, v, keep, "math")
    out = attention(q, k, v, keep, backend, chunk_size=64)
    real = keep[:, None, :, None].expand_as(out)
    # Loose enough for TF32 matmuls (some images force them on), far below a wrong formula.
    assert (out - ref)[real].abs().max() <= 2e-3
    gq = torch.autograd.grad(out.sum(), q)[0]
    gr = torch.autograd.grad(ref.sum(), q)[0]
    assert (gq - gr).norm() / gr.norm() <= 5e-3


def test_sdpa_uses_the_flash_kernel_without_padding():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot be used
        out = attention(q, k, v, None, "sdpa")
    assert out.shape == q.shape


def test_masked_lm_uses_the_flash_kernel_with_an_all_ones_mask():
    """The whole model, not just attention(): MLMCollator's all-ones mask must not keep SDPA
    from the FlashAttention kernel. A padded batch still needs a mask, so flash alone must
    refuse it, which shows this test can fail."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(tiny_config(attention="sdpa")).cuda().train()
    ids, mask = random_batch(B=2, T=32)
    ids, mask = ids.cuda(), mask.cuda()  # all ones
    labels = torch.where(torch.arange(32, device="cuda") % 5 == 0, ids, -100)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), \
            torch.autocast("cuda", dtype=torch.bfloat16):  # raises if flash cannot be used
        loss = model(ids, mask, labels=labels).loss
        loss.backward()
        assert torch.isfinite(loss)
        mask[1, 20:] = 0
        with pytest.raises(RuntimeError):
            model(ids, mask, labels=labels)


def test_model_parity_on_cuda():
    torch.manual_seed(0)
    model = minibert.BertModel(tiny_config()).eval()
    ids, mask = random_batch(pad_from=20)
    with torch.no_grad():
        cpu = model(ids, mask).last_hidden_state
        gpu = model.cuda()(ids.cuda(), mask.cuda()).last_hidden_state.cpu()
    assert (cpu - gpu)[mask.bool()].abs().max() <= 1e-4


def test_real_out_of_memory_is_reported_with_the_micro_batch(tmp_path):
    """A real allocation failure inside a step becomes one clear TrainingError."""
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.training.engine import TrainingError, train

    tok, ds = tiny_corpus(tmp_path, seq_len=64)
    model = tiny_model(tok).cuda()  # weights in place before the memory is taken away
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(free - 16 * 2**20, 0), dtype=torch.uint8, device="cuda")
    try:
        # 64 sequences of 64 tokens in one micro-batch need far more than the 16 MiB left.
        with raises(TrainingError, "out of memory", "(64, 64)", "--micro-batch-size"):
            train(model, ds, collator(tok), train_config(batch_size=64, max_steps=1,
                                                     warmup=0),
                  tmp_path / "run", ctx=_cuda_ctx())
    finally:
        del hog
        torch.cuda.empty_cache()


def test_a_real_out_of_memory_is_recovered_by_auto_micro_batch(tmp_path, caplog):
    """With auto_micro_batch, a real allocation failure halves the micro-batch until the step
    fits, and the run computes what the whole batch computes (accumulation is exact).

    The memory left free is measured, not guessed: halfway between what one step needs with
    the whole batch of 128 and with micro-batches of 16."""
    from dataclasses import replace

    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.training.engine import train

    tok, ds = tiny_corpus(tmp_path, seq_len=64)
    cfg = train_config(batch_size=128, max_steps=2, auto_micro_batch=True)

    def run(name, micro=None):
        model = tiny_model(tok).cuda()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_reserved()
        train(model, ds, collator(tok), replace(cfg, micro_batch_size=micro), tmp_path / name,
              ctx=_cuda_ctx())
        return model, torch.cuda.max_memory_reserved() - before

    run("warm-up")  # one-time allocations (the cuBLAS workspace...) out of the measurements
    whole, whole_bytes = run("whole")
    _, small_bytes = run("micro16", micro=16)
    if whole_bytes < 2 * small_bytes:
        pytest.fail(f"the whole batch needs {whole_bytes >> 20} MiB and micro-batches of 16 "
                    f"{small_bytes >> 20} MiB: too close to squeeze one and not the other")
    model = tiny_model(tok).cuda()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(free - (whole_bytes + small_bytes) // 2, 0), dtype=torch.uint8,
                      device="cuda")
    try:
        with caplog.at_level("WARNING", logger="minibert"):
            train(model, ds, collator(tok), cfg, tmp_path / "squeezed", ctx=_cuda_ctx())
    finally:
        del hog
        torch.cuda.empty_cache()
    assert "out of memory with micro-batch (128, 64)" in caplog.text
    assert [r["step"] for r in _rows(tmp_path / "squeezed")] == [1, 2]
    losses = [r["loss"] for r in _rows(tmp_path / "squeezed")]
    assert losses == pytest.approx([r["loss"] for r in _rows(tmp_path / "whole")], rel=1e-5)
    for p, q in zip(model.parameters(), whole.parameters()):
        assert (p - q).norm() <= 1e-4 * q.norm() + 1e-7  # summation order differs, nothing else


def _cuda_ctx():
    from minibert.training.distributed import DistContext

    return DistContext(device=torch.device("cuda", 0))


def _rows(path):
    import json

    return [json.loads(line) for line in open(path / "metrics.jsonl") if '"loss"' in line]
