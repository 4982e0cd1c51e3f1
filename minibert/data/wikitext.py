"""WikiText (Merity et al. 2016): download it once, read it as a list of articles.

Four zip archives: `wikitext-{2,103}-raw-v1` (`wiki.train.raw`, ...) and `wikitext-{2,103}-v1`
(tokenized: `wiki.train.tokens`, ..., or pytorch/examples' `train.txt`, ...). A download is
resumed with an HTTP Range request, kept only once its CRCs verify and extracted into a
folder renamed into place last: an interrupted run leaves nothing that looks complete.
"""
from __future__ import annotations

import http.client
import logging
import os
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterable, Iterator, Optional

from ..atomic import PathLike, WriteError, publish_file, replace_folder, reported
from ..paths import check_readable, file_present
from .text import iter_lines

logger = logging.getLogger(__name__)

BASE_URL = "https://wikitext.smerity.com"
# name of the archive -> folder inside it, and the file suffix of its splits
WIKITEXT_VARIANTS = {"wikitext-2-raw-v1": ("wikitext-2-raw", ".raw"),
                     "wikitext-103-raw-v1": ("wikitext-103-raw", ".raw"),
                     "wikitext-2-v1": ("wikitext-2", ".tokens"),
                     "wikitext-103-v1": ("wikitext-103", ".tokens")}
SPLITS = ("train", "valid", "test")
WIKITEXT_LAYOUTS = ({s: f"wiki.{s}.raw" for s in SPLITS}, {s: f"wiki.{s}.tokens" for s in SPLITS},
                    {s: f"{s}.txt" for s in SPLITS})


class DownloadError(RuntimeError):
    """The archive could not be fetched or did not verify."""


def download_wikitext(name: str = "wikitext-2-raw-v1", cache_dir: Optional[PathLike] = None,
                      url: Optional[str] = None, *, timeout: float = 30.0) -> Path:
    """Download and extract a WikiText variant (one of `WIKITEXT_VARIANTS`) into `cache_dir`
    (default `$MINIBERT_CACHE` or `~/.cache/minibert`); return the folder of its splits. No
    network access when it is there already. `url`: default `<base>/<name>.zip`, `<base>`
    `$MINIBERT_WIKITEXT_URL` (a mirror) or `BASE_URL`; `timeout` in seconds."""
    if name not in WIKITEXT_VARIANTS:
        raise ValueError(f"unknown WikiText variant {name!r}; choose one of "
                         f"{sorted(WIKITEXT_VARIANTS)}")
    folder, suffix = WIKITEXT_VARIANTS[name]
    env = os.environ.get("MINIBERT_CACHE")  # as tokenizer_train.default_cache_dir
    cache = Path(cache_dir or env or Path.home() / ".cache" / "minibert").expanduser()
    target = cache / folder
    expected = [f"wiki.{s}{suffix}" for s in SPLITS]
    if all((target / f).is_file() for f in expected):
        logger.info("WikiText %s already at %s", name, target)
        return target
    base = os.environ.get("MINIBERT_WIKITEXT_URL") or BASE_URL
    url = url or f"{base.rstrip('/')}/{name}.zip"
    zip_path = cache / f"{name}.zip"
    if not (zip_path.is_file() and _zip_ok(zip_path, folder, expected)):
        part = cache / f"{name}.zip.part"
        # A complete .part (killed between download and rename) needs no network.
        resumed = False
        if not (part.is_file() and _zip_ok(part, folder, expected)):
            resumed = _fetch(url, part, timeout, name, expected)
        if not _zip_ok(part, folder, expected):
            part.unlink(missing_ok=True)
            if not resumed:
                raise DownloadError(
                    f"the archive downloaded from {url} is not a valid {name} zip (bad CRC or "
                    f"missing {folder}/{expected[0]}); it was deleted, run again to retry")
            # The server's copy may have changed in between: start over once from byte 0.
            logger.warning("resumed download of %s did not verify; restarting", name)
            _fetch(url, part, timeout, name, expected)
            if not _zip_ok(part, folder, expected):
                part.unlink(missing_ok=True)
                raise DownloadError(f"the archive downloaded from {url} does not verify")
        publish_file(part, zip_path)

    def extract(new: Path) -> None:  # the zip's one folder, as the new target's content
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(new)
        for entry in (new / folder).iterdir():
            os.replace(entry, new / entry.name)
        (new / folder).rmdir()

    # The target appears complete or not at all; an incomplete one is replaced whole.
    replace_folder(target, extract, owns=lambda name: True)
    logger.info("WikiText %s extracted to %s", name, target)
    return target


def _zip_ok(path: Path, folder: str, expected: list[str]) -> bool:
    """True when `path` is a zip whose CRCs check and that holds the expected splits."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            return all(f"{folder}/{f}" in names for f in expected) and zf.testzip() is None
    except Exception:  # BadZipFile, zlib.error, EOFError, ...: any of them means "not ok"
        return False


def _fetch(url: str, part: Path, timeout: float, name: str, expected: list[str]) -> bool:
    """Append the bytes of `url` to `part` (resuming if it exists); True if resumed."""
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "minibert"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # "range not satisfiable": our partial file is bad
            part.unlink()
            return _fetch(url, part, timeout, name, expected)
        raise DownloadError(_offline_message(url, name, expected,
                                             f"HTTP {e.code} {e.reason}")) from e
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(_offline_message(url, name, expected,
                                             str(getattr(e, "reason", e)))) from e
    with response:
        resumed = offset > 0 and response.status == 206
        if offset and not resumed:
            logger.info("server ignored the resume request; downloading %s from the start", name)
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        progress = _Progress(name, total, offset)
        try:
            # A write that fails is the cache's (a full or read-only disk), said as such; a
            # read that fails is the download's, which the next call resumes.
            with reported(part):
                part.parent.mkdir(parents=True, exist_ok=True)
                f = open(part, "ab" if resumed else "wb")
            try:
                while block := response.read(1 << 16):
                    with reported(part):
                        f.write(block)
                    progress.update(len(block))
            finally:
                with reported(part):
                    f.close()  # the last of the buffer is written here
        except WriteError:
            raise
        except (OSError, http.client.HTTPException) as e:
            raise DownloadError(f"download of {url} was interrupted ({e}); the partial file "
                                f"{part} is kept and the next call resumes it") from e
        finally:
            progress.close()
    return resumed


def _offline_message(url: str, name: str, expected: list[str], reason: str) -> str:
    folder = WIKITEXT_VARIANTS[name][0]
    return (f"could not download {url} ({reason}). If this machine has no internet access, "
            f"download {name}.zip by hand, unzip it, and pass the folder that holds "
            f"{', '.join(expected)} (i.e. '{folder}/') as data_dir= or --data-dir.")


class _Progress:
    """Download progress: a tqdm bar on a terminal when tqdm is installed, else a log line a 10%."""

    def __init__(self, name: str, total: Optional[int], initial: int) -> None:
        self.name, self.total, self.done, self.next_log, self.bar = name, total, initial, 0.1, None
        if sys.stderr is not None and sys.stderr.isatty():
            try:
                from tqdm.auto import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=name)
        if self.bar is None:
            logger.info("downloading %s (%s bytes)", name, total if total else "unknown size")

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.total and self.done / self.total >= self.next_log:
            logger.info("%s: %.0f%% of %d bytes", self.name, 100 * self.done / self.total,
                        self.total)
            self.next_log += 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------- reading
def load_wikitext(path: PathLike) -> dict[str, list[str]]:
    """Read the splits in `path` (or in a subfolder), named as one of `WIKITEXT_LAYOUTS`,
    as `{split: [article, ...]}`: each from its top-level ` = Title = ` line to the next,
    lines stripped, blank ones dropped. Other files are not read (`load_corpus` refuses)."""
    root = Path(path).expanduser()
    check_readable(root)  # a loop, a link to nothing, a folder that may not be entered
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; load_wikitext reads the folder that "
                                 f"holds WikiText's split files")
    for folder in [root] + sorted(p for p in root.iterdir() if p.is_dir()):
        for layout in WIKITEXT_LAYOUTS:
            found = {s: folder / f for s, f in layout.items() if file_present(folder / f)}
            if found:
                out = {s: split_articles(iter_lines(p)) for s, p in found.items()}
                if not any(out.values()):
                    raise ValueError(f"the WikiText files in {folder} hold no text: "
                                     f"{', '.join(str(p) for p in found.values())}")
                return out
    looked = ", ".join(f for layout in WIKITEXT_LAYOUTS for f in layout.values())
    raise FileNotFoundError(
        f"no WikiText splits in {root} (nor its subfolders): looked for {looked}. Pass the "
        f"folder that holds them, or call download_wikitext() to fetch them.")


def split_articles(lines: Iterable[str]) -> list[str]:
    """Group WikiText lines into articles at top-level ` = Title = ` headings."""
    return list(iter_articles(lines))


def iter_articles(lines: Iterable[str]) -> Iterator[str]:
    """`split_articles`, one article at a time: memory holds one article, not the split."""
    current: list[str] = []
    for line in lines:
        s = line.strip()  # a top-level heading is " = Title = ", a section " = = Section = = "
        if current and len(s) > 4 and s.startswith("= ") and s.endswith(" =") \
                and not s.startswith("= ="):
            yield "\n".join(current)
            current = []
        if s:
            current.append(s)
    if current:
        yield "\n".join(current)
