"""CUDA-only paths: skipped on machines without a GPU, run by benchmarks/gpu_check.sh."""

import pytest
import torch

import minibert
from conftest import random_batch, tiny_config
from minibert.attention import attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_fp16_training_with_grad_scaler(tmp_path):
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.engine import train

    tok, ds = tiny_corpus(tmp_path)
    result = train(tiny_model(tok), ds, collator(tok), train_config(precision="fp16"),
                   tmp_path / "run", ctx=_cuda_ctx())
    assert result["precision"] == "fp16"
    losses = [r["loss"] for r in _rows(tmp_path / "run")]
    assert losses[-1] < losses[0]


def test_bf16_is_the_default_on_cuda(tmp_path):
    from engine_utils import collator, tiny_corpus, tiny_model, train_config
    from minibert.engine import train

    tok, ds = tiny_corpus(tmp_path)
    result = train(tiny_model(tok), ds, collator(tok), train_config(max_steps=2),
                   tmp_path / "run", ctx=_cuda_ctx())
    assert result["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def test_peak_memory_tracks_cuda_allocations():
    from minibert.runtime import current_memory_mb, peak_memory_mb, reset_peak_memory

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
    assert (out - ref)[real].abs().max() <= 1e-4  # TF32 may be on for matmuls
    gq = torch.autograd.grad(out.sum(), q)[0]
    gr = torch.autograd.grad(ref.sum(), q)[0]
    assert (gq - gr).norm() / gr.norm() <= 1e-3


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
    from minibert.engine import TrainingError, train

    tok, ds = tiny_corpus(tmp_path, seq_len=64)
    model = tiny_model(tok).cuda()  # weights in place before the memory is taken away
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(free - 16 * 2**20, 0), dtype=torch.uint8, device="cuda")
    try:
        # 64 sequences of 64 tokens in one micro-batch need far more than the 16 MiB left.
        with pytest.raises(TrainingError, match=r"out of memory .* micro-batch \(64, 64\)"):
            train(model, ds, collator(tok), train_config(batch_size=64, max_steps=1),
                  tmp_path / "run", ctx=_cuda_ctx())
    finally:
        del hog
        torch.cuda.empty_cache()


def _cuda_ctx():
    from minibert.distributed import DistContext

    return DistContext(device=torch.device("cuda", 0))


def _rows(path):
    import json

    return [json.loads(line) for line in open(path / "metrics.jsonl") if '"loss"' in line]
