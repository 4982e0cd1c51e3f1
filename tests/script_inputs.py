"""One small input of each kind the example scripts read, and an argv for each script that
runs one quick step on it: for the tests that hold every script to the same rule."""

import json
import random

from engine_utils import WORDS, wikitext_folder

SCRIPTS = ["finetune_classification", "finetune_token_classification", "finetune_qa",
           "finetune_multitask", "pretrain_wikitext", "distill", "embed"]


def make_inputs(d):
    """One small input of each kind the scripts read, written into the folder `d`."""
    rng = random.Random(0)
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{' '.join(rng.sample(WORDS, 5))}\t{'ab'[i % 2]}\n" for i in range(16)))
    (d / "train.conll").write_text("\n\n".join(
        f"{rng.choice(WORDS)} O\nann B-PER\n{rng.choice(WORDS)} O" for _ in range(16)) + "\n")
    context = " ".join(WORDS[:12])
    (d / "train.json").write_text(json.dumps({"data": [{"paragraphs": [{
        "context": context, "qas": [{"id": f"q{i}", "question": "cat ?",
                                     "answers": [{"text": "mat", "answer_start":
                                                  context.index("mat")}]}]}
        for i in range(8)]}]}))
    (d / "texts.txt").write_text("the cat sat\non a mat\n")
    (d / "wiki").mkdir()
    wikitext_folder(d / "wiki", (("train", 20), ("valid", 4)))
    return d


def argv(script, d, model, out, *extra):
    """`script`'s argv on the inputs in `d`: from the checkpoint folder `model` (None: from
    scratch, where the script can), into `out`, one step; `extra` flags last."""
    # From a checkpoint (`model`, or --init-from among `extra`), the model is the checkpoint's
    start = ["--init-from", str(model)] if model else [] if "--init-from" in extra else \
        ["--preset", "tiny", "--vocab-size", "100"]
    fine = ["--out", str(out), "--cache-dir", str(d / "cache"), *start, "--seq-len", "16",
            "--batch-size", "4", "--max-steps", "1", "--no-progress", "--precision", "fp32",
            *extra]
    mlm = ["--data-dir", str(d / "wiki"), "--out", str(out), "--cache-dir", str(d / "cache"),
           "--seq-len", "16", "--batch-size", "4", "--max-steps", "1", "--eval-batches", "1",
           "--no-progress", "--precision", "fp32", *extra]
    return {
        "finetune_classification": ["--train", str(d / "train.tsv"), "--eval",
                                    str(d / "train.tsv"), "--text-column", "sentence",
                                    "--label-column", "label", *fine],
        "finetune_token_classification": ["--train", str(d / "train.conll"), "--eval",
                                          str(d / "train.conll"), *fine],
        "finetune_qa": ["--train", str(d / "train.json"), "--eval", str(d / "train.json"),
                        "--doc-stride", "4", *fine],
        "finetune_multitask": ["--task", f"t:token:{d / 'train.conll'}:{d / 'train.conll'}",
                               *fine],
        "pretrain_wikitext": [*start, *mlm],
        "distill": ["--teacher", str(model), *mlm],
        "embed": ["--model", str(model), "--input", str(d / "texts.txt"), "--out",
                  str(out / "v.npy"), *extra],
    }[script]


def make_inputs_with_teacher(d):
    """`make_inputs`, plus d/teacher: a one-layer masked LM with its tokenizer, the model
    that distillation and embedding start from."""
    import minibert
    import torch

    make_inputs(d)
    tok = minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=100,
                                                 min_frequency=1, use_cache=False)
    torch.manual_seed(0)
    minibert.BertForMaskedLM(minibert.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
        intermediate_size=64, max_position_embeddings=64)).save_pretrained(d / "teacher",
                                                                          tokenizer=tok)
    return d


def script_argv(script, d, out, *extra):
    """From scratch where the script can; distillation and embedding from d/teacher."""
    model = d / "teacher" if script in ("distill", "embed") else None
    return argv(script, d, model, out, *extra)
