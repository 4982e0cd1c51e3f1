"""examples/embed.py end to end on a tiny model folder: the .npy against SentenceEncoder, the
--query ranking against cosine similarity computed here, and the one-line errors."""

import logging

import numpy as np
import pytest
import torch

import minibert
from minibert.tasks.sentence import SentenceEncoder

from conftest import tiny_config
from engine_utils import WORDS, load_example
from facts import assert_carries

LINES = ["the cat sat on a mat", "", "dogs ran far away from home", "   ",
         "birds sang songs of rain in spring", "green trees near rivers", "the cat sat"]
TEXTS = [t for t in LINES if t.strip()]
NUMBERS = [i + 1 for i, t in enumerate(LINES) if t.strip()]  # the file's line numbers


@pytest.fixture(scope="module")
def embed():
    return load_example("embed")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    tok = minibert.Tokenizer.train_from_iterator([" ".join(WORDS)] * 5, vocab_size=100,
                                                 min_frequency=1, use_cache=False)
    minibert.set_seed(0)
    minibert.BertForMaskedLM(tiny_config(vocab_size=tok.vocab_size)).save_pretrained(
        folder, tokenizer=tok)
    return folder


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def run(embed, capsys, *argv):
    rc = embed.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_writes_the_encoders_vectors_for_the_non_blank_lines(embed, model_dir, texts_file,
                                                             tmp_path, capsys, caplog):
    out = tmp_path / "new" / "deeper" / "vectors.npy"  # folders that do not exist yet
    with caplog.at_level(logging.INFO, logger="embed"):
        rc, _, err = run(embed, capsys, "--model", model_dir, "--input", texts_file,
                         "--out", out, "--pooling", "max", "--batch-size", "2")
    assert (rc, err) == (0, "")
    assert "5 texts" in caplog.text and "2 blank lines skipped" in caplog.text
    vectors = np.load(out)
    assert vectors.shape == (len(TEXTS), 32) and vectors.dtype == np.float32
    want = SentenceEncoder.from_pretrained(model_dir, pooling="max").encode(TEXTS)
    np.testing.assert_allclose(vectors, want.numpy(), atol=1e-6, rtol=0)


def test_query_prints_the_nearest_lines_by_cosine(embed, model_dir, texts_file, tmp_path,
                                                  capsys):
    out = tmp_path / "v.npy"
    rc, stdout, err = run(embed, capsys, "--model", model_dir, "--input", texts_file,
                          "--out", out, "--normalize", "--query", "The cat sat.",
                          "--top-k", "3")
    assert (rc, err) == (0, "")
    vectors = torch.from_numpy(np.load(out))
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(len(TEXTS)))
    query = SentenceEncoder.from_pretrained(model_dir).encode(["The cat sat."])[0]
    cosine = torch.nn.functional.cosine_similarity(vectors, query[None], dim=1)  # (N,)
    best = cosine.argsort(descending=True)[:3].tolist()
    rows = [line.split("\t") for line in stdout.splitlines() if "\t" in line]
    assert [r[1:] for r in rows] == [[f"line {NUMBERS[i]}", TEXTS[i]] for i in best]
    assert rows[0][1:] == ["line 7", "the cat sat"]  # the same words, lowercased, win
    np.testing.assert_allclose([float(r[0]) for r in rows], cosine[best].numpy(), atol=1e-4)


def test_top_k_beyond_the_texts_lists_them_all(embed, model_dir, texts_file, tmp_path, capsys):
    rc, stdout, _ = run(embed, capsys, "--model", model_dir, "--input", texts_file,
                        "--out", tmp_path / "v.npy", "--query", "rain", "--top-k", "50")
    assert rc == 0 and sum("\t" in line for line in stdout.splitlines()) == len(TEXTS)


def test_existing_out_is_replaced_without_leftovers(embed, model_dir, texts_file, tmp_path,
                                                    capsys):
    out = tmp_path / "out" / "v.npy"
    out.parent.mkdir()
    out.write_bytes(b"old")
    rc, _, err = run(embed, capsys, "--model", model_dir, "--input", texts_file, "--out", out)
    assert (rc, err) == (0, "")
    assert np.load(out).shape == (len(TEXTS), 32)
    assert sorted(p.name for p in out.parent.iterdir()) == ["v.npy"]  # no temporary file


def error_cases(tmp, model_dir, texts_file):
    """(name, argv changes, the facts the error must carry: the flag, the path, the value)."""
    no_tok = tmp / "no-tokenizer"
    minibert.BertModel(tiny_config(vocab_size=100)).save_pretrained(no_tok)
    blank = tmp / "blank.txt"
    blank.write_text("\n  \n\n", encoding="utf-8")
    (tmp / "a-folder").mkdir()
    return [
        ("missing model", {"--model": tmp / "nope"}, [str(tmp / "nope"), "config.json"]),
        ("no tokenizer", {"--model": no_tok}, [str(no_tok), "tokenizer.json", "vocab.txt"]),
        ("not a model folder", {"--model": tmp}, [str(tmp / "config.json")]),
        ("blank input", {"--input": blank}, [str(blank), "no text"]),
        ("missing input", {"--input": tmp / "missing.txt"}, [str(tmp / "missing.txt")]),
        ("input is a folder", {"--input": tmp / "a-folder"}, ["--input", str(tmp / "a-folder")]),
        ("out is a folder", {"--out": tmp / "a-folder"}, ["--out", str(tmp / "a-folder")]),
        ("out under a file", {"--out": texts_file / "v.npy"},
         ["--out", str(texts_file / "v.npy"), str(texts_file), "not a folder"]),
        ("too long", {"--max-length": 65}, ["--max-length 65", "max_position_embeddings=64"]),
        ("top-k", {"--top-k": 0}, ["--top-k"]),
        # an empty text ranks the lines by nothing that was asked
        ("empty query", {"--query": ""}, ["--query", "''"]),
        ("blank query", {"--query": " \t "}, ["--query", repr(" \t ")]),
    ]


def test_bad_input_is_one_line_and_status_2(embed, model_dir, texts_file, tmp_path, capsys):
    for name, change, facts in error_cases(tmp_path, model_dir, texts_file):
        args = {"--model": model_dir, "--input": texts_file, "--out": tmp_path / "v.npy"}
        args.update(change)
        rc, _, err = run(embed, capsys, *[x for kv in args.items() for x in kv])
        assert rc == 2, name
        assert err.startswith("error: ") and err.count("\n") == 1, (name, err)
        assert_carries(err, *facts)

        assert not (tmp_path / "v.npy").exists(), name


def test_unknown_pooling_is_refused_by_the_parser(embed, model_dir, texts_file, tmp_path,
                                                  capsys):
    with pytest.raises(SystemExit) as e:
        embed.main(["--model", str(model_dir), "--input", str(texts_file),
                    "--out", str(tmp_path / "v.npy"), "--pooling", "sum"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert_carries(err, "--pooling", "'sum'", "max")

