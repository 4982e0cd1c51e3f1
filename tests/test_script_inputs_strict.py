"""Every input of every script read as strictly as the next: the same reader for every text
file (strict UTF-8), the same words for a path that cannot be read (a loop of links, a link
to nothing, a permission refused), a long text read like a short one, and the settings a
message names said as the flags the user gave."""

import random
import shutil

import pytest

from engine_utils import load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries
from script_inputs import SCRIPTS, make_inputs_with_teacher, script_argv

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
