"""No weight is lost silently: a model whose tensors a folder has no place for is refused by
every writer of folders, before anything is written; and LoRA through peft trains on the
attention projections, merges, saves, and loads in transformers."""

import importlib.util

import pytest
import torch
import torch.nn as nn

import minibert
from conftest import tiny_config
from facts import raises

pytest.importorskip("safetensors")
_PEFT = importlib.util.find_spec("peft") is not None


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 7:] = 0
    return ids, mask


class Extra(minibert.BertForSequenceClassification):
    """A user's subclass with a tensor of its own."""

    def __init__(self, config):
        super().__init__(config, num_labels=2)
        self.temperature = nn.Parameter(torch.ones(()))


class Wrapped(nn.Module):
    """A projection wrapped by hand, as adapter libraries do."""

    def __init__(self, linear):
        super().__init__()
        self.base_layer = linear

    def forward(self, x):
        return self.base_layer(x)


def test_a_tensor_of_the_user_s_own_is_refused_before_anything_is_written(tmp_path):
    model = Extra(tiny_config())
    with raises(ValueError, "temperature", "would be lost"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_wrapped_projection_is_refused_and_an_old_folder_is_kept(tmp_path):
    model = minibert.BertModel(tiny_config())
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    model.blocks[1].attn.out = Wrapped(model.blocks[1].attn.out)
    with raises(ValueError, "blocks.1.attn.out.base_layer.weight", "merge_and_unload"):
        model.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_modern_model_is_checked_alike(tmp_path):
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=99)
    model = minibert.BertForMaskedLM(config)
    model.head.dense = Wrapped(model.head.dense)
    with raises(ValueError, "head.dense.base_layer.weight"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_multitask_export_is_checked_too(tmp_path):
    model = minibert.BertMultiTask(tiny_config(), {"a": ("sequence", 2)})
    model.bert.blocks[0].attn.qkv = Wrapped(model.bert.blocks[0].attn.qkv)
    with raises(ValueError, "bert.blocks.0.attn.qkv.base_layer.weight", "task 'a'"):
        model.export("a", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not _PEFT, reason="peft is not installed")
def test_lora_through_peft_trains_merges_saves_and_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = minibert.BertForSequenceClassification(tiny_config(), num_labels=2)
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
                                           target_modules=["qkv", "out"],
                                           modules_to_save=["classifier"]))
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = _batch()
    labels = torch.tensor([0, 1, 1, 0])
    losses = []
    for _ in range(8):
        loss = lora(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    lora.eval()
    with torch.no_grad():
        want = lora(input_ids=ids, attention_mask=mask).logits
    with raises(ValueError, "merge_and_unload"):
        lora.base_model.model.save_pretrained(tmp_path / "unmerged")
    merged = lora.merge_and_unload()
    assert type(merged) is minibert.BertForSequenceClassification
    # the encoder's embeddings are as they were; the adapted projections have moved
    assert torch.equal(merged.bert.embeddings.word.weight, frozen["bert.embeddings.word.weight"])
    assert not torch.equal(merged.bert.blocks[0].attn.qkv.weight,
                           frozen["bert.blocks.0.attn.qkv.weight"])
    merged.save_pretrained(tmp_path / "merged")
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "merged")
    ours = minibert.BertForSequenceClassification.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        a = ours.eval()(ids, mask).logits
        b = theirs.eval()(input_ids=ids, attention_mask=mask).logits
    assert (a - want).abs().max().item() <= 1e-5
    assert (b - want).abs().max().item() <= 1e-5
