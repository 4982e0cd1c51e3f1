"""Every python snippet in the README runs, in order, so the docs cannot rot."""

import random
import re
from pathlib import Path

import pytest

import minibert

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_snippets_run(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "cache"))
    # What the snippets expect to find: a BERT checkpoint folder with its tokenizer, and a
    # small text corpus.
    rng = random.Random(0)
    words = "the a cat dog sat ran on under mat tree river home far near song rain".split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(30, 120))) for _ in range(200)]
    Path("corpus.txt").write_text("\n\n".join(docs))
    tok = minibert.Tokenizer.train_from_iterator(docs, vocab_size=200, use_cache=False)
    minibert.BertForMaskedLM(minibert.BertConfig.preset("tiny", vocab_size=8192)
                             ).save_pretrained("bert-checkpoint", tokenizer=tok)

    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) >= 4
    namespace: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    assert Path("exported/model.safetensors").is_file() and Path("exported/vocab.txt").is_file()
    assert Path("runs/readme/metrics.jsonl").is_file()


def test_walkthrough_snippets_run(tmp_path, monkeypatch):
    """Every python block of docs/walkthrough.md runs, in order, in one namespace."""
    import tempfile

    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "cache"))
    # The snippets write only under tempfile's directory: point it into tmp_path.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # The snippets use tiny tensors, for which one thread is fastest; with more threads than
    # free cores, their spin-waits make each step many times slower on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blocks = python_blocks(ROOT / "docs" / "walkthrough.md")
        assert len(blocks) >= 15
        namespace: dict = {}
        for i, code in enumerate(blocks):
            exec(compile(code, f"docs/walkthrough.md python block {i + 1}", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    workdirs = list(tmp_path.glob("minibert-walkthrough-*"))
    assert len(workdirs) == 1 and (workdirs[0] / "corpus.tok").is_file()
    assert not (tmp_path / "cache").exists()  # no tokenizer cache written


def test_research_snippets_run(tmp_path, monkeypatch):
    """Every python block of docs/research.md runs, in order, in one namespace. torch.compile
    traces with aot_eager: the tracing is what the page shows (no graph break, the same
    outputs), and inductor's code generation would add a minute on a CPU."""
    import functools

    import torch

    for extra in ("peft", "onnx", "onnxscript", "onnxruntime", "safetensors", "transformers",
                  "accelerate"):
        pytest.importorskip(extra)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    blocks = python_blocks(ROOT / "docs" / "research.md")
    assert len(blocks) >= 9
    namespace: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/research.md python block {i + 1}", "exec"), namespace)
    assert namespace["accuracy"] > 0.9
    H = namespace["H"]
    delta = namespace["delta"]
    assert not delta[H:2 * H].any() and delta[:H].any() and delta[2 * H:].any()
    assert (tmp_path / "lora-merged" / "model.safetensors").is_file()
    assert abs(namespace["logits"] - namespace["want"].numpy()).max() < 1e-5
    assert namespace["result"]["steps"] == 30
    assert (tmp_path / "runs" / "length" / "metrics.jsonl").is_file()
    assert namespace["theirs"].config.architectures == ["BertForSequenceClassification"]


def test_machine_room_snippets_run():
    """Every python block of docs/machine-room.md runs, in order, in one namespace: each
    hand-written kernel against the plain call it replaces, and the allocator's page faults."""
    blocks = python_blocks(ROOT / "docs" / "machine-room.md")
    assert len(blocks) >= 4
    namespace: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/machine-room.md python block {i + 1}", "exec"), namespace)
    assert namespace["in_place"].shape == namespace["plain"].shape


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", "docs/walkthrough.md", "docs/finetune.md",
                                 "docs/qa.md", "docs/multitask.md", "docs/distill.md",
                                 "docs/machine-room.md", "docs/runs.md", "docs/research.md",
                                 "docs/results-map.md", "docs/quality.md"])
def test_local_links_point_at_files_and_headings_that_exist(doc):
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve()
        assert linked.exists(), f"{doc} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"{doc}: no heading #{anchor}"


def test_walkthrough_code_links_name_symbols_that_exist():
    """`[`name`](../minibert/file.py)` must name a class, function, method (`Class.method`) or
    module-level constant that `file` defines, so a move or a rename that leaves the
    walkthrough behind fails here. Links name the symbol, never a line range: lines drift."""
    import ast

    text = (ROOT / "docs" / "walkthrough.md").read_text()
    assert not re.findall(r"\(\.\./minibert/[\w/]+\.py#L\d+", text), "link by name, not by line"
    links = re.findall(r"\[`([\w.]+)`\]\(\.\./(minibert/[\w/]+\.py)\)", text)
    assert len(links) > 30
    for name, file in links:
        defs = set()
        for node in ast.parse((ROOT / file).read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs.add(node.name)
                for sub in node.body if isinstance(node, ast.ClassDef) else []:
                    if isinstance(sub, ast.FunctionDef):
                        defs.add(f"{node.name}.{sub.name}")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defs.update(t.id for t in targets if isinstance(t, ast.Name))
        assert name in defs or name == Path(file).name, \
            f"walkthrough links {name} to {file}, which does not define it"


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_qa_doc_snippet_finds_the_answer(tmp_path, monkeypatch, capsys, preset):
    """docs/qa.md's snippet prints the answer a model trained on its example gives: "Lima",
    the context's own text, found from the answer's token positions through the windows and
    their character offsets. With segment embeddings and without (ModernBERT)."""
    import torch

    from minibert.data import QAExample, TaskCollator, encode_qa

    monkeypatch.chdir(tmp_path)
    tok = minibert.Tokenizer.train_from_iterator(
        ["what is the capital ? the capital is lima ."] * 20, vocab_size=40, use_cache=False)
    torch.manual_seed(0)
    model = minibert.BertForQuestionAnswering(minibert.BertConfig.preset(
        preset, vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, hidden_dropout=0.0,
        attention_dropout=0.0))
    # Trained on the snippet's example until it answers it: the answer is "Lima", 15
    # characters into the context.
    context = "The capital is Lima."
    example = QAExample("1", "What is the capital?", context, [("Lima", 15)], False)
    assert context[15:19] == "Lima"
    batch = TaskCollator(tok.pad_id, segments=model.config.has_segments)(
        encode_qa(tok, [example], max_len=384, doc_stride=128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, as for the walkthrough
    try:
        for _ in range(40):
            loss = model(batch["input_ids"], batch["attention_mask"],
                         batch.get("token_type_ids"), start_positions=batch["start_positions"],
                         end_positions=batch["end_positions"]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.1, loss.item()

    model.save_pretrained("runs/squad/final", tokenizer=tok)
    (block,) = python_blocks(ROOT / "docs" / "qa.md")
    capsys.readouterr()
    exec(compile(block, "docs/qa.md python block 1", "exec"), {})
    assert capsys.readouterr().out == "Lima\n"


def _bash_lines(text: str) -> list[str]:
    return [ln.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
            for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_offline_command_trains_on_a_copy_without_a_train_split(tmp_path):
    """The offline copy of WikiText-2 holds only valid and test: the README's command for it
    names the splits to use, and runs."""
    import shlex

    from engine_utils import load_example, wikitext_folder

    (line,) = [ln for ln in _bash_lines((ROOT / "README.md").read_text())
               if "pretrain_wikitext.py" in ln and "--train-split" in ln]
    args = shlex.split(line)[2:]  # after `python examples/pretrain_wikitext.py`
    folder = tmp_path / "wikitext-2-raw"
    folder.mkdir()
    wikitext_folder(folder, sizes=(("valid", 20), ("test", 8)))
    args = [str(folder) if a == "path/to/wikitext-2-raw" else
            str(tmp_path / a) if a.startswith("runs/") else a for a in args]
    assert str(folder) in args
    small = ["--cache-dir", str(tmp_path / "cache"), "--preset", "tiny", "--vocab-size", "100",
             "--seq-len", "16", "--batch-size", "4", "--max-steps", "1", "--eval-batches", "1",
             "--no-progress", "--precision", "fp32"]
    assert load_example("pretrain_wikitext").main(args + small) == 0


def test_readme_says_what_pip_installs_and_how_to_get_the_cpu_build():
    """torch from PyPI on Linux is the CUDA build, about 20 nvidia-* wheels; the README's one
    way to the CPU build was an index that is not always reachable."""
    text = (ROOT / "README.md").read_text()
    start = text.index("### Installing torch")
    section = text[start:text.index("\n## ", start)]
    assert "CUDA build" in section and "nvidia-" in section and "several GB" in section
    installs = [ln for ln in _bash_lines(section) if ln.startswith("pip install")]
    assert any("download.pytorch.org/whl/cpu" in ln for ln in installs)
    # and ways that need only the index you have: a +cpu version it serves, a wheel file
    assert any('"torch==' in ln and '+cpu"' in ln for ln in installs)
    assert any(ln.endswith(".whl") for ln in installs)
    assert "torch.version.cuda" in section
    # CI's comment says what its pin installs, which depends on where pip looks
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci and "CUDA build" in ci and "+cpu" in ci
