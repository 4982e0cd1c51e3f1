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


# peft's task types, each with the minibert class and transformers' Auto class it stands for.
TASKS = {"SEQ_CLS": ("BertForSequenceClassification", "AutoModelForSequenceClassification"),
         "TOKEN_CLS": ("BertForTokenClassification", "AutoModelForTokenClassification"),
         "QUESTION_ANS": ("BertForQuestionAnswering", "AutoModelForQuestionAnswering"),
         "FEATURE_EXTRACTION": ("BertModel", "AutoModel")}


def _task_targets(task, ids):
    if task == "SEQ_CLS":
        return {"labels": torch.tensor([0, 1, 1, 0])}
    if task == "TOKEN_CLS":
        return {"labels": ids % 2}
    if task == "QUESTION_ANS":
        return {"start_positions": torch.tensor([1, 2, 3, 4]),
                "end_positions": torch.tensor([2, 3, 5, 6])}
    return {}


def _task_outputs(out):
    names = ("logits", "start_logits", "end_logits", "last_hidden_state")
    return [getattr(out, n) for n in names if getattr(out, n, None) is not None]


@pytest.mark.skipif(not _PEFT, reason="peft is not installed")
@pytest.mark.parametrize("task,preset", [("SEQ_CLS", "tiny"), ("TOKEN_CLS", "modernbert-tiny"),
                                         ("QUESTION_ANS", "tiny"),
                                         ("FEATURE_EXTRACTION", "modernbert-tiny"),
                                         ("SEQ_CLS", "modernbert-tiny")])
def test_peft_task_types_train_save_reload_merge_and_load_in_transformers(tmp_path, task,
                                                                          preset):
    """peft's documented path: get_peft_model with a task_type, a few steps, the adapter
    saved and loaded onto the base folder again, merged, saved, and read by transformers'
    Auto class with the adapted model's outputs. peft calls the model with
    `inputs_embeds=None`, `return_dict` and the output flags as None."""
    transformers = pytest.importorskip("transformers")
    from peft import LoraConfig, PeftModel, get_peft_model

    ours, auto = TASKS[task]
    cls = getattr(minibert, ours)
    config = minibert.BertConfig.preset(preset, vocab_size=99, max_position_embeddings=64)
    torch.manual_seed(0)
    base = cls(config, **({"num_labels": 2} if task.endswith("CLS") else {}))
    base.save_pretrained(tmp_path / "base")
    before = getattr(base, "bert", base).blocks[0].attn.qkv.weight.detach().clone()
    lora = get_peft_model(base, LoraConfig(task_type=task, r=4, lora_alpha=8,
                                           target_modules=["qkv", "out"]))
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = _batch()
    for _ in range(2):
        out = lora(input_ids=ids, attention_mask=mask, **_task_targets(task, ids))
        loss = out.loss if task != "FEATURE_EXTRACTION" else out.last_hidden_state.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    lora.save_pretrained(tmp_path / "adapter")

    again = PeftModel.from_pretrained(cls.from_pretrained(tmp_path / "base"),
                                      tmp_path / "adapter").eval()
    with torch.no_grad():
        want = _task_outputs(lora.eval()(input_ids=ids, attention_mask=mask))
        reloaded = _task_outputs(again(input_ids=ids, attention_mask=mask))
    merged = again.merge_and_unload()
    assert type(merged) is cls
    assert not torch.equal(getattr(merged, "bert", merged).blocks[0].attn.qkv.weight, before)
    merged.save_pretrained(tmp_path / "merged")
    theirs = getattr(transformers, auto).from_pretrained(tmp_path / "merged",
                                                        attn_implementation="eager").eval()
    with torch.no_grad():
        got = _task_outputs(theirs(input_ids=ids, attention_mask=mask))
    keep = mask.bool()
    for a, b, c in zip(want, reloaded, got):
        assert (a - b).abs().max().item() <= 1e-5
        if c.shape[:2] == keep.shape:  # per token: compare the real tokens
            a, c = a[keep], c[keep]
        assert (a - c).abs().max().item() <= 1e-4
