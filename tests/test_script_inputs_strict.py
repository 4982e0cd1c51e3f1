"""Every input of every script read as strictly as the next: the same reader for every text
file (strict UTF-8), the same words for a path that cannot be read (a loop of links, a link
to nothing, a permission refused), a long text read like a short one, and the settings a
message names said as the flags the user gave."""

import os
import random
import shutil
from pathlib import Path

import pytest

from engine_utils import from_checkpoint, load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries
from script_inputs import SCRIPTS, argv, make_inputs_with_teacher, script_argv

# The text file each script's argv (script_inputs.argv) reads, relative to the inputs folder.
TEXT_INPUT = {"finetune_classification": "train.tsv", "finetune_token_classification":
              "train.conll", "finetune_qa": "train.json", "finetune_multitask": "train.conll",
              "pretrain_wikitext": "wiki/train.txt", "distill": "wiki/train.txt",
              "embed": "texts.txt"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs_with_teacher(tmp_path_factory.mktemp("inputs"))


def one_line(capsys, script, args, code=2):
    got = load_example(script).main(args)
    err = capsys.readouterr().err.strip()
    assert got == code and err.startswith("error: ") and "\n" not in err, (got, err)
    return err


def with_copy(inputs, tmp_path, script):
    """The inputs folder copied into tmp_path (without the teacher, which is only read), and
    the script's argv on the copy: a test may spoil the copy's files."""
    d = tmp_path / "in"
    shutil.copytree(inputs, d, ignore=shutil.ignore_patterns("teacher", "cache"))
    (d / "teacher").symlink_to(inputs / "teacher")
    return d, script_argv(script, d, tmp_path / "out")


# ---- one strict reader for every text file ---------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS)
def test_a_text_input_that_is_not_utf8_is_refused_before_anything_is_written(
        script, inputs, tmp_path, capsys):
    """embed.py took 5,000 random bytes as --input and wrote 25 vectors, with a warning;
    the fine-tuning scripts refused the same file. Every script refuses it now, naming the
    file, the line and the byte, before --out or the token cache is touched."""
    d, args = with_copy(inputs, tmp_path, script)
    spoiled = d / TEXT_INPUT[script]
    good = spoiled.read_bytes()
    # at a line in the middle of the file (SQuAD's JSON is one line: at a space)
    cut = good.index(b"\n" if b"\n" in good else b" ", len(good) // 2) + 1
    line = good[:cut].count(b"\n") + 1
    spoiled.write_bytes(good[:cut] + b"caf\xe9 " + good[cut:])
    err = one_line(capsys, script, args)
    assert_carries(err, str(spoiled), f"line {line}", "0xe9", "iconv -f utf-8 -t utf-8 -c")
    assert not (tmp_path / "out").exists()
    assert not any((d / "cache").glob("tokens/*")), list((d / "cache").glob("tokens/*"))


def test_embed_refuses_random_bytes_as_input(inputs, tmp_path, capsys):
    noise = tmp_path / "noise.txt"
    noise.write_bytes(random.Random(0).randbytes(5000))
    args = script_argv("embed", inputs, tmp_path / "out")
    args[args.index("--input") + 1] = str(noise)
    err = one_line(capsys, "embed", args)
    assert_carries(err, str(noise), "not valid UTF-8", "byte 0x", "line ")
    assert "Warning" not in err
    assert not (tmp_path / "out").exists()


# ---- a long text is read like any other ------------------------------------------------------

@pytest.mark.parametrize("kind", ["tsv", "csv"])
def test_a_text_of_a_megabyte_is_read_and_truncated(kind, inputs, tmp_path, capsys):
    """It was refused with the csv module's "field larger than field limit (131072)";
    docs/finetune.md says every text is truncated to --seq-len."""
    d, args = with_copy(inputs, tmp_path, "finetune_classification")
    rows = (d / "train.tsv").read_text().splitlines()
    rows[1] = " ".join(["cat sat, on a mat"] * 60_000) + "\t" + rows[1].split("\t")[1]
    if kind == "csv":
        rows = [",".join('"' + f.replace('"', '""') + '"' for f in r.split("\t")) for r in rows]
    data = d / f"train.{kind}"
    data.write_text("\n".join(rows) + "\n")
    assert data.stat().st_size > 2**20
    for flag in ("--train", "--eval"):
        args[args.index(flag) + 1] = str(data)
    assert load_example("finetune_classification").main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "final").is_dir()


# ---- a path that cannot be read, said as what it is ------------------------------------------

# Every input path of every script: (script, flag, what the flag names). TRAIN and EVAL are
# the paths inside finetune_multitask.py's --task NAME:KIND:TRAIN:EVAL.
INPUT_PATHS = [
    *[(s, flag, kind) for s in ("finetune_classification", "finetune_token_classification",
                                "finetune_qa")
      for flag, kind in (("--train", "file"), ("--eval", "file"), ("--init-from", "folder"))],
    ("finetune_multitask", "TRAIN", "file"), ("finetune_multitask", "EVAL", "file"),
    ("finetune_multitask", "--init-from", "folder"),
    ("pretrain_wikitext", "--data-dir", "folder"), ("pretrain_wikitext", "--init-from", "folder"),
    ("distill", "--data-dir", "folder"), ("distill", "--teacher", "folder"),
    ("embed", "--input", "file"), ("embed", "--model", "folder"),
]


def given(script, flag, path, inputs, out):
    """The script's argv with `path` as the value of `flag`, and how the message names it."""
    args = script_argv(script, inputs, out)
    if flag in ("TRAIN", "EVAL"):
        at = args.index("--task") + 1
        name, kind, train, evaluation = args[at].split(":")
        args[at] = ":".join([name, kind, *((path, evaluation) if flag == "TRAIN"
                                           else (train, path))])
        return args, f"--task {name}'s {flag} {path}"
    if flag in args:
        args[args.index(flag) + 1] = str(path)
    else:
        args += [flag, str(path)]
    return from_checkpoint(args), f"{flag} {path}"


def real_input(script, flag, inputs):
    """The path the script's argv gives for `flag` (or the model folder it would start from)."""
    if flag == "--init-from":
        return inputs / "teacher"
    args = script_argv(script, inputs, inputs / "unused")
    if flag in ("TRAIN", "EVAL"):
        return args[args.index("--task") + 1].split(":")[2 if flag == "TRAIN" else 3]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("script,flag,kind", INPUT_PATHS)
def test_a_symlink_loop_is_named_as_one(script, flag, kind, inputs, tmp_path, capsys):
    """A loop of links given as --train was reported as "not found"."""
    loop = tmp_path / f"loop.{kind}"
    loop.symlink_to(tmp_path / "round")
    (tmp_path / "round").symlink_to(loop)
    args, said = given(script, flag, str(loop), inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, said, "loop of symbolic links", "round")
    assert "not found" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script,flag,kind", INPUT_PATHS)
def test_a_dangling_symlink_is_named_with_its_target(script, flag, kind, inputs, tmp_path,
                                                     capsys):
    link = tmp_path / f"moved.{kind}"
    link.symlink_to(tmp_path / "elsewhere" / "gone")
    args, said = given(script, flag, str(link), inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, said, "symbolic link to nothing", str(tmp_path / "elsewhere" / "gone"),
                   "does not exist")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script,flag,kind", INPUT_PATHS)
def test_a_path_this_user_may_not_read_is_a_permission_error(script, flag, kind, inputs,
                                                             tmp_path, capsys, monkeypatch):
    """As root every file is readable, so the refusal is made by os.access, for that path
    alone: what the check asks of the system, answered as for a user without the right."""
    path = real_input(script, flag, inputs)
    if kind == "file":  # a copy: --train and --eval name one file in the argv
        path = shutil.copy(path, tmp_path / f"own-{Path(path).name}")
    path = str(path)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if os.fspath(p) == path
                        else real_access(p, mode, *a, **k))
    args, said = given(script, flag, path, inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, said, "permission denied", "folder" if kind == "folder" else "file")
    assert "not found" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root reads every file whatever its mode")
@pytest.mark.parametrize("script,flag,kind", [("finetune_classification", "--train", "file"),
                                              ("embed", "--model", "folder")])
def test_a_file_without_read_permission_is_a_permission_error(script, flag, kind, inputs,
                                                              tmp_path, capsys):
    locked = tmp_path / "locked"
    shutil.copytree(inputs / "teacher", locked) if kind == "folder" else \
        shutil.copy(real_input(script, flag, inputs), locked)
    locked.chmod(0)
    try:
        args, said = given(script, flag, str(locked), inputs, tmp_path / "out")
        assert_carries(one_line(capsys, script, args), said, "permission denied")
    finally:
        locked.chmod(0o700)


MODEL_FLAGS = [("finetune_classification", "--init-from"), ("pretrain_wikitext", "--init-from"),
               ("distill", "--teacher"), ("embed", "--model")]


@pytest.mark.parametrize("script,flag", MODEL_FLAGS)
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json",
                                  "tokenizer_config.json"])
def test_a_model_folders_file_linked_to_nothing_is_named(script, flag, name, inputs, tmp_path,
                                                         capsys):
    """A download cache links a model folder's files to blobs kept elsewhere; one whose blob
    is gone was "not found", or passed over: tokenizer.json for the vocab.txt beside it,
    the casing in tokenizer_config.json (read with vocab.txt) for the default."""
    folder = tmp_path / "model"
    shutil.copytree(inputs / "teacher", folder)
    (folder / name).unlink()
    (folder / name).symlink_to(tmp_path / "blobs" / "3f2a")
    if name == "tokenizer_config.json":  # read beside vocab.txt; tokenizer.json has its own
        (folder / "tokenizer.json").unlink()
    args, _ = given(script, flag, str(folder), inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, str(folder / name), "symbolic link to nothing",
                   str(tmp_path / "blobs" / "3f2a"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_corpus_file_linked_to_nothing_is_refused_not_skipped(script, inputs, tmp_path,
                                                                capsys):
    """A text folder's .txt link to nothing was left out of the corpus without a word."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(f"document {i} of words" for i in range(40)))
    (corpus / "b.txt").symlink_to(tmp_path / "gone.txt")
    args, _ = given(script, "--data-dir", str(corpus), inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, str(corpus / "b.txt"), "symbolic link to nothing")
    assert not (tmp_path / "out").exists()


# ---- messages name the flags the user gave ---------------------------------------------------

def modern_model(inputs, folder):
    """A modernbert-tiny masked LM with the teacher's tokenizer: ModernBERT's task heads."""
    import minibert

    tok = minibert.Tokenizer.from_pretrained(inputs / "teacher")
    minibert.BertForMaskedLM(minibert.BertConfig.preset(
        "modernbert-tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
        max_position_embeddings=64)).save_pretrained(folder, tokenizer=tok)
    return folder


def test_multitask_says_a_modern_model_in_the_flag_that_chose_it(inputs, tmp_path, capsys):
    """`--preset modernbert-tiny` was refused with "task_head='transform' is not supported
    here": a field the user never gave."""
    args = script_argv("finetune_multitask", inputs, tmp_path / "out", "--preset",
                       "modernbert-tiny")
    err = one_line(capsys, "finetune_multitask", args)
    assert_carries(err, "--preset modernbert-tiny", "--preset mini")
    assert "task_head" not in err and "BertMultiTask" not in err
    folder = modern_model(inputs, tmp_path / "modern")
    err = one_line(capsys, "finetune_multitask",
                   from_checkpoint([*args, "--init-from", str(folder)]))
    assert_carries(err, f"--init-from {folder}", "ModernBERT")
    assert "task_head" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,said", [
    (["--norm", "pre"], ["--norm pre", "--norm post"]),
    (["--no-bias"], ["--no-bias", "--bias"]),
    (["--position", "rope"], ["--position rope", "--position learned"]),
    (["--global-every", "3"], ["--global-every 3", "--global-every 1"]),
    (["--norm", "post"], ["--norm post"]),  # the checkpoint's own: it sets it, not the flag
])
def test_an_architecture_flag_against_init_from_is_said_in_flags(flags, said, inputs, tmp_path,
                                                                 capsys):
    """It said "--norm contradicts DIR, whose norm_position is 'post'" (and "--bias" for a
    --no-bias given)."""
    args = script_argv("pretrain_wikitext", inputs, tmp_path / "out", "--init-from",
                       str(inputs / "teacher"), *flags)
    err = one_line(capsys, "pretrain_wikitext", args)
    assert_carries(err, *said, f"--init-from {inputs / 'teacher'}")
    assert not {"norm_position", "global_every", "bias is", "position is"} & set(
        err.replace("--", " ").split()), err


FROM_A_CHECKPOINT = ["pretrain_wikitext", "finetune_classification",
                     "finetune_token_classification", "finetune_qa", "finetune_multitask"]


@pytest.mark.parametrize("script", FROM_A_CHECKPOINT)
@pytest.mark.parametrize("flags,said", [
    (["--preset", "mini"], ["--preset mini"]),  # the default, typed: given all the same
    (["--vocab-size", "5000"], ["--vocab-size 5000"]),
    (["--preset", "small", "--vocab-size=8192"], ["--preset small", "--vocab-size 8192"]),
])
def test_a_model_shaping_flag_beside_init_from_is_refused(script, flags, said, inputs,
                                                          tmp_path, capsys):
    """The checkpoint's config.json sets the model and its tokenizer the vocabulary: the
    run went on with both flags ignored, as if the model were the one they describe."""
    teacher = inputs / "teacher"
    # argv gives --preset and --vocab-size only without a checkpoint: these are the test's
    err = one_line(capsys, script, argv(script, inputs, teacher, tmp_path / "out", *flags))
    assert_carries(err, *said, f"--init-from {teacher}")
    assert not (tmp_path / "out").exists()


def test_the_flags_that_shape_no_weight_may_be_given_beside_init_from(inputs, tmp_path,
                                                                       capsys):
    args = argv("pretrain_wikitext", inputs, inputs / "teacher", tmp_path / "out",
                "--dropout", "0.1", "--attention", "math")
    assert load_example("pretrain_wikitext").main(args) == 0, capsys.readouterr().err


@pytest.mark.parametrize("script,extra,said", [
    ("pretrain_wikitext", ["--seq-len", "600"], ["--seq-len 600", "--preset tiny", "512"]),
    ("finetune_classification", ["--seq-len", "600"], ["--seq-len 600", "--preset tiny"]),
    ("finetune_classification", ["--init-from", "{teacher}", "--seq-len", "100"],
     ["--seq-len 100", "--init-from {teacher}", "64"]),
    ("pretrain_wikitext", ["--init-from", "{teacher}", "--seq-len", "100"],
     ["--seq-len 100", "--init-from {teacher}", "64"]),
    ("distill", ["--seq-len", "100"], ["--seq-len 100", "--teacher {teacher}", "64"]),
    ("embed", ["--max-length", "100"], ["--max-length 100", "--model {teacher}", "64"]),
])
def test_a_length_beyond_the_positions_names_the_flag_that_chose_the_model(
        script, extra, said, inputs, tmp_path, capsys):
    """"exceeds the model's max_position_embeddings=512": which model was the user's to
    guess; it is the one --preset or --init-from gave."""
    teacher = str(inputs / "teacher")
    extra = [x.replace("{teacher}", teacher) for x in extra]
    err = one_line(capsys, script, script_argv(script, inputs, tmp_path / "out", *extra))
    assert_carries(err, *[s.replace("{teacher}", teacher) for s in said])


@pytest.mark.parametrize("extra,said", [(["--warmup-steps", "50"], "--max-steps 1"),
                                        (["--warmup-steps", "50", "--decay-steps", "10"],
                                         "--decay-steps 10")])
def test_a_warmup_longer_than_the_run_names_the_flag_that_sets_its_length(
        extra, said, inputs, tmp_path, capsys):
    err = one_line(capsys, "pretrain_wikitext", script_argv("pretrain_wikitext", inputs,
                                                            tmp_path / "out", *extra))
    assert_carries(err, "--warmup-steps", said)
    assert "total_steps" not in err


@pytest.mark.parametrize("script,extra,said", [
    ("pretrain_wikitext", ["--norm", "pre"], ["--norm: checkpoint 'post', now 'pre'"]),
    ("pretrain_wikitext", ["--attention", "math"], ["--attention: checkpoint 'sdpa'"]),
    ("pretrain_wikitext", ["--dropout", "0.1"], ["--dropout: checkpoint 0.0, now 0.1"]),
    ("pretrain_wikitext", ["--preset", "mini"], ["num_layers of --preset: checkpoint 2, now 4"]),
    ("finetune_classification", ["--preset", "mini"], ["of --preset: checkpoint 2, now 4"]),
    ("distill", ["--student-preset", "mini"], ["of --student-preset: checkpoint 2, now 4"]),
])
def test_a_resume_with_another_model_names_its_flags(script, extra, said, inputs, tmp_path,
                                                     capsys):
    """It said "model norm_position: checkpoint 'post', now 'pre'"."""
    out = tmp_path / "out"
    assert load_example(script).main(script_argv(script, inputs, out)) == 0
    err = one_line(capsys, script, script_argv(script, inputs, out, "--resume",
                                               "--max-steps", "2", *extra))
    assert_carries(err, *said)
    assert "model " not in err.replace("a model", ""), err
    assert err.count("--dropout") <= 1, err


def test_distill_names_the_vocabulary_flag_not_the_argument(inputs, tmp_path, capsys):
    """A teacher whose tokenizer was replaced: "pass allow_vocab_mismatch=True"."""
    import minibert
    from engine_utils import WORDS

    folder = tmp_path / "teacher"
    shutil.copytree(inputs / "teacher", folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        (folder / name).unlink()
    minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 20 + ["zebra quokka"] * 5,
                                           vocab_size=100, min_frequency=1,
                                           use_cache=False).save(folder)
    args, _ = given("distill", "--teacher", str(folder), inputs, tmp_path / "out")
    err = one_line(capsys, "distill", args)
    assert_carries(err, "--allow-vocab-mismatch")
    assert "allow_vocab_mismatch" not in err


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_decay_steps_0_is_refused_as_in_fine_tuning(script, inputs, tmp_path, capsys):
    """Read as "unset" (0 is falsy) it ran with the default horizon instead."""
    err = one_line(capsys, script, script_argv(script, inputs, tmp_path / "out",
                                               "--decay-steps", "0"))
    assert_carries(err, "--decay-steps 0", ">= 1")


@pytest.mark.parametrize("script", ["pretrain_wikitext", "distill"])
def test_a_split_too_short_for_one_block_names_the_split_and_seq_len(script, inputs, tmp_path,
                                                                      capsys):
    """It said "not enough for one block of seq_len=16" of a file in the token cache."""
    wiki = tmp_path / "wiki"
    shutil.copytree(inputs / "wiki", wiki)
    (wiki / "valid.txt").write_text(" = Short = \n\n cat sat \n")
    args, _ = given(script, "--data-dir", str(wiki), inputs, tmp_path / "out")
    err = one_line(capsys, script, args)
    assert_carries(err, "--seq-len 16", "--eval-split valid")
    assert "seq_len" not in err
    assert not (tmp_path / "out").exists()
