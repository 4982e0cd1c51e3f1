"""WikiText download (from a local HTTP server, never the internet) and reading."""
import errno
import http.server
import io
import logging
import socket
import threading
import zipfile
from functools import partial
from pathlib import Path

import pytest

from facts import raises
from minibert.data import DownloadError, download_wikitext, load_wikitext
from minibert.data.wikitext import split_articles

ARTICLE_1 = [" = Alpha = ", " ", " Alpha is the first letter . ", " ", " = = History = = ", " ",
             " It came from Phoenician aleph . ", " "]
ARTICLE_2 = [" = Beta = ", " ", " Beta is second ; = not a heading . ", " ",
             " = = = Deep section = = = ", " Deeper text . ", " "]


def wiki_text(n_repeat=1):
    lines = [" "]
    for _ in range(n_repeat):
        lines += ARTICLE_1 + ARTICLE_2
    return "\n".join(lines) + "\n"


def make_zip(folder="wikitext-2-raw", suffix=".raw", n_repeat=50) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for split in ("train", "valid", "test"):
            zf.writestr(f"{folder}/wiki.{split}{suffix}", wiki_text(n_repeat))
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves one payload; honours Range requests only if ``ranges`` is set."""

    payload = b""
    ranges = True
    seen_ranges: list = []

    def do_GET(self):
        body, status = self.payload, 200
        rng = self.headers.get("Range")
        self.seen_ranges.append(rng)
        self.seen_paths.append(self.path)
        headers = {}
        if rng and self.ranges:
            start = int(rng.split("=")[1].rstrip("-"))
            if start >= len(body):
                self.send_response(416)
                self.end_headers()
                return
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            body, status = body[start:], 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep test output quiet
        pass


@pytest.fixture
def server():
    """Start a local server; yields a function (payload, ranges) -> url."""
    servers = []

    def start(payload, ranges=True):
        handler = type("H", (_Handler,), {"payload": payload, "ranges": ranges,
                                          "seen_ranges": [], "seen_paths": []})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(httpd)
        start.handler = handler
        return f"http://127.0.0.1:{httpd.server_address[1]}/wikitext-2-raw-v1.zip"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/wikitext-2-raw-v1.zip"


def test_download_extracts_and_is_then_a_noop(server, tmp_path, caplog):
    url = server(make_zip())
    with caplog.at_level(logging.INFO, logger="minibert.data.wikitext"):
        out = download_wikitext("wikitext-2-raw-v1", cache_dir=tmp_path, url=url)
    assert "100%" in caplog.text  # progress reaches the log when there is no terminal
    assert out == tmp_path / "wikitext-2-raw"
    assert sorted(p.name for p in out.iterdir()) == ["wiki.test.raw", "wiki.train.raw",
                                                     "wiki.valid.raw"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wikitext-2-raw",
                                                          "wikitext-2-raw-v1.zip"]
    # Second call: the data is there, so no network at all (the URL is dead).
    assert download_wikitext("wikitext-2-raw-v1", cache_dir=tmp_path,
                             url=closed_port_url()) == out
    assert len(load_wikitext(out)["train"]) == 100


def test_default_cache_dir_from_environment(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "env"))
    out = download_wikitext(url=server(make_zip()))
    assert out == tmp_path / "env" / "wikitext-2-raw"


def test_offline_gives_one_clear_message_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    url = closed_port_url()
    # the address tried, the archive to fetch instead, the files it holds, where to pass them
    with raises(DownloadError, url, "wikitext-2-raw-v1.zip", "wiki.train.raw", "data_dir=",
                "--data-dir"):
        download_wikitext("wikitext-2-raw-v1", cache_dir=cache, url=url, timeout=5)

    assert not cache.exists() or not any(cache.iterdir())


def test_corrupt_archive_is_rejected_and_removed(server, tmp_path):
    good = make_zip()
    bad = good[:100] + bytes(500) + good[600:]  # damaged file data: the CRC check fails
    url = server(bad)
    with raises(DownloadError, url, "zip", "CRC"):  # where it came from, and what is wrong
        download_wikitext(cache_dir=tmp_path, url=url)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_resumes_with_range(server, tmp_path):
    payload = make_zip()
    (tmp_path / "wikitext-2-raw-v1.zip.part").write_bytes(payload[:1000])
    url = server(payload, ranges=True)
    out = download_wikitext(cache_dir=tmp_path, url=url)
    assert server.handler.seen_ranges == ["bytes=1000-"]
    assert (tmp_path / "wikitext-2-raw-v1.zip").read_bytes() == payload
    assert not (tmp_path / "wikitext-2-raw-v1.zip.part").exists()
    assert (out / "wiki.valid.raw").is_file()


def test_resume_restarts_when_server_ignores_range(server, tmp_path):
    payload = make_zip()
    (tmp_path / "wikitext-2-raw-v1.zip.part").write_bytes(b"garbage from another file" * 10)
    out = download_wikitext(cache_dir=tmp_path, url=server(payload, ranges=False))
    assert (tmp_path / "wikitext-2-raw-v1.zip").read_bytes() == payload
    assert (out / "wiki.test.raw").is_file()


def test_bad_resume_restarts_from_scratch(server, tmp_path):
    payload = make_zip()
    # Right length prefix, wrong bytes: the resumed file fails its CRC, so start over.
    (tmp_path / "wikitext-2-raw-v1.zip.part").write_bytes(b"\0" * 1000)
    download_wikitext(cache_dir=tmp_path, url=server(payload, ranges=True))
    assert server.handler.seen_ranges == ["bytes=1000-", None]
    assert (tmp_path / "wikitext-2-raw-v1.zip").read_bytes() == payload


def test_unknown_variant():
    with pytest.raises(ValueError, match="wikitext-103-raw-v1"):
        download_wikitext("wikitext-5")


@pytest.mark.parametrize("names", [
    {s: f"wiki.{s}.raw" for s in ("train", "valid", "test")},
    {s: f"wiki.{s}.tokens" for s in ("train", "valid", "test")},
    {s: f"{s}.txt" for s in ("valid", "test")},  # a layout with the train split missing
])
def test_load_wikitext_layouts(tmp_path, names):
    for split, name in names.items():
        (tmp_path / name).write_text(wiki_text(3), encoding="utf-8")
    data = load_wikitext(tmp_path)
    assert sorted(data) == sorted(names)
    for articles in data.values():
        assert len(articles) == 6
        assert articles[0].startswith("= Alpha =") and "= = History = =" in articles[0]
        assert articles[1].startswith("= Beta =") and "Deeper text ." in articles[1]


def test_load_wikitext_finds_the_folder_inside_a_parent(tmp_path):
    (tmp_path / "wikitext-2").mkdir()
    (tmp_path / "wikitext-2" / "wiki.valid.tokens").write_text(wiki_text(), encoding="utf-8")
    assert list(load_wikitext(tmp_path)) == ["valid"]


def test_split_articles_only_at_top_level_titles():
    lines = ["intro line", " = A = ", "a text", " = = A.1 = = ", "more a", " = B = ", "b"]
    assert split_articles(lines) == ["intro line", "= A =\na text\n= = A.1 = =\nmore a",
                                     "= B =\nb"]


def test_load_wikitext_missing_files_lists_what_was_looked_for(tmp_path):
    (tmp_path / "notes.md").write_text("nothing here")
    with pytest.raises(FileNotFoundError) as err:
        load_wikitext(tmp_path)
    for name in ("wiki.train.raw", "wiki.valid.tokens", "test.txt"):
        assert name in str(err.value)
    with raises(FileNotFoundError, str(tmp_path / "absent")):
        load_wikitext(tmp_path / "absent")


def test_load_wikitext_empty_files(tmp_path):
    (tmp_path / "valid.txt").write_text(" \n \n")
    with raises(ValueError, str(tmp_path / "valid.txt"), "no text"):
        load_wikitext(tmp_path)



def test_load_wikitext_refuses_bytes_that_are_not_utf8(tmp_path):
    (tmp_path / "wiki.valid.raw").write_bytes(b" = T = \n ok \n caf\xe9 \xff ok \n")
    with raises(ValueError, str(tmp_path / "wiki.valid.raw"), "line 3", "0xe9", "iconv"):
        load_wikitext(tmp_path)


def test_download_then_load_partial_callable(server, tmp_path):
    # The tokenized variant lands in its own folder name.
    url = server(make_zip("wikitext-2", ".tokens"))
    out = partial(download_wikitext, "wikitext-2-v1", cache_dir=tmp_path)(url=url)
    assert out.name == "wikitext-2" and len(load_wikitext(out)["test"]) == 100


SHARED_WIKITEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "wikitext-2"


@pytest.mark.skipif(not SHARED_WIKITEXT.is_dir(), reason="WikiText-2 sample not present")
def test_integration_on_wikitext2(tmp_path):
    """The three steps on real WikiText-2 text: tokenizer, token file, an MLM batch."""
    from minibert.data import MLMCollator, PackedMLMDataset, tokenize_to_memmap
    from minibert.data.tokenizer import Tokenizer

    data = load_wikitext(SHARED_WIKITEXT)
    assert set(data) == {"valid", "test"} and len(data["valid"]) == 60
    assert data["valid"][0].startswith("= Homarus gammarus =")
    tok = Tokenizer.train_from_iterator(data["valid"], vocab_size=4000, cache_dir=tmp_path)
    tf = tokenize_to_memmap(data["valid"], tok, tmp_path / "valid.tok")
    assert tf.n_docs == 60 and tf.n_tokens > 200_000
    ds = PackedMLMDataset(tf, 128, tokenizer=tok)
    batch = MLMCollator(tok)([ds[i] for i in range(32)])
    assert batch["input_ids"].shape == (32, 128)
    assert "lobster" in tok.decode(ds[0]["input_ids"])


def test_complete_part_file_is_used_without_network(tmp_path):
    (tmp_path / "wikitext-2-raw-v1.zip.part").write_bytes(make_zip())
    out = download_wikitext(cache_dir=tmp_path, url=closed_port_url())
    assert (out / "wiki.train.raw").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wikitext-2-raw",
                                                          "wikitext-2-raw-v1.zip"]


def test_the_main_job_trains_on_wikitext_103_from_a_mirror(server, tmp_path, monkeypatch):
    """`--dataset wikitext-103-raw-v1` end to end: fetched from $MINIBERT_WIKITEXT_URL (a local
    server standing in for the real host), extracted, read, trained on, exported."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from engine_utils import load_example

    url = server(make_zip("wikitext-103-raw", ".raw", n_repeat=60))
    monkeypatch.setenv("MINIBERT_WIKITEXT_URL", url.rsplit("/", 1)[0] + "/")
    pretrain = load_example("pretrain_wikitext")
    cache, out = tmp_path / "cache", tmp_path / "run"
    assert pretrain.main(["--dataset", "wikitext-103-raw-v1", "--cache-dir", str(cache),
                          "--out", str(out), "--preset", "tiny", "--vocab-size", "120",
                          "--seq-len", "32", "--batch-size", "8", "--max-steps", "3",
                          "--eval-batches", "1", "--no-progress", "--precision", "fp32"]) == 0
    assert server.handler.seen_paths == ["/wikitext-103-raw-v1.zip"]
    assert sorted(p.name for p in (cache / "wikitext-103-raw").iterdir()) == [
        "wiki.test.raw", "wiki.train.raw", "wiki.valid.raw"]
    assert json.loads((out / "eval.json").read_text())["steps"] == 3
    assert (out / "final" / "config.json").is_file()


@pytest.mark.parametrize("code, said", [(errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied")])
def test_a_cache_that_cannot_be_written_is_named_not_called_an_interrupted_download(
        code, said, server, tmp_path, monkeypatch):
    """The partial download's file could not be written: that is the cache's problem,
    said as such, not a download "interrupted" that the next call would resume."""
    from unwritable import refuse

    cache = tmp_path / "cache"
    cache.mkdir()
    url = server(make_zip())
    refuse(monkeypatch, lambda p: p.parent == cache, code)
    with raises(OSError, str(cache / "wikitext-2-raw-v1.zip.part"), said, str(cache)) as info:
        download_wikitext(cache_dir=cache, url=url)
    assert not isinstance(info.value, DownloadError) and "interrupted" not in str(info.value)
    assert list(cache.iterdir()) == []
