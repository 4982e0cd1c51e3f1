"""Each command-line setting is declared once, with one default: the field it fills in the
preset of its kind of script (`pretrain.MAIN_JOB`, `finetune.FINETUNE`)."""

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from minibert import cli

from minibert.cli import finetune, pretrain
from minibert.training.state import TrainConfig
from engine_utils import load_example
from facts import assert_carries

ROOT = Path(__file__).resolve().parents[1]

# Each fine-tuning script's required flags, given as bare values: parse_args reads no file.
FINETUNE_REQUIRED = {
    "finetune_classification": ["--train", "t", "--eval", "e", "--text-column", "text",
                                "--label-column", "label"],
    "finetune_token_classification": ["--train", "t", "--eval", "e"],
    "finetune_qa": ["--train", "t", "--eval", "e"],
    "finetune_multitask": ["--task", "a:sequence:t:e"],
}

# Flags that several scripts declare each for themselves, with a meaning of their own: how
# a script reads its data (--seq-len truncates a text, or cuts a sentence into windows).
OWN_MEANING = {"--seq-len", "--train", "--eval", "--text-column", "--text-pair-column",
               "--label-column", "--max-train-examples", "--scheme"}
# embed.py and blimp.py compute, they do not train: each has its own parser, where
# --batch-size counts texts (or masked copies), --out names their output and --precision
# defaults to fp32.
SCORERS = {"embed.py", "blimp.py"}


def _differs(cfg: TrainConfig, preset: TrainConfig) -> dict:
    mine, theirs = cfg.flat(), preset.flat()
    return {name: (mine[name], theirs[name]) for name in mine if mine[name] != theirs[name]}


@pytest.mark.parametrize("script,argv,job", [
    ("pretrain_wikitext", [], pretrain.MAIN_JOB),
    ("distill", ["--teacher", "t"], pretrain.DISTILL)])
def test_pretraining_defaults_are_the_preset(script, argv, job):
    args = load_example(script).parse_args(argv)
    # A fresh start's horizon is --max-steps (the preset's decay_steps is None: the same)
    assert _differs(pretrain.train_config(args), job.train) == {
        "decay_steps": (job.train.max_steps, None)}
    assert job.train == pretrain.MAIN_JOB.train  # distillation trains as the main job does
    assert (args.preset, args.position, args.seq_len, args.mask_prob, args.eval_mask_prob,
            args.dataset, args.train_split, args.eval_split, args.keep_freed_memory) == (
        job.preset, job.position, job.seq_len, job.mask_prob, job.eval_mask_prob, job.dataset,
        job.train_split, job.eval_split, job.keep_freed_memory)
    if script == "pretrain_wikitext":
        assert args.vocab_size == job.vocab_size
        assert args.dropout is None and job.dropout == 0.0  # build_model reads the preset


def test_the_main_jobs_positions_are_rotary_and_say_who_loads_them():
    """With no model flag the main job trains `mini` with rotary positions (chosen by GLUE
    and BLiMP per CPU-hour, benchmarks/RESULTS.md), a folder minibert alone loads;
    `--position learned` is classic BERT, which transformers' BertForMaskedLM loads, and
    distillation's student keeps its own preset's switches."""
    import minibert
    from minibert.interop.hf import transformers_class

    def built(script, argv):
        args = load_example(script).parse_args(argv)
        preset = args.student_preset if script == "distill" else args.preset
        return minibert.BertForMaskedLM(minibert.BertConfig.preset(
            preset, vocab_size=64, **pretrain.architecture_overrides(args)))

    main_job = built("pretrain_wikitext", [])
    assert main_job.config.position == "rope" and transformers_class(main_job) is None
    assert transformers_class(built("pretrain_wikitext", ["--position", "learned"])) == \
        "BertForMaskedLM"
    assert transformers_class(built("distill", ["--teacher", "t"])) == "BertForMaskedLM"


def test_main_job_numbers():
    """The main job's defaults, as README.md and docs/ quote them."""
    job = pretrain.MAIN_JOB
    assert (job.preset, job.train.lr, job.train.min_lr, job.train.batch_size,
            job.train.max_steps, job.seq_len, job.mask_prob, job.eval_mask_prob,
            job.train.seq_len_warmup, job.train.seq_len_start, job.dropout) == (
        "mini", 1e-3, 1e-5, 32, 1000, 128, 0.3, 0.15, 0.5, 16, 0.0)


def test_each_learning_rate_default_is_set_once():
    """The main job's rate is TrainConfig's own default (state.py says why), which its
    preset takes rather than repeats; fine-tuning sets its own, one from random weights and
    one from a checkpoint (finetune.py says why)."""
    assert pretrain.MAIN_JOB.train.lr == TrainConfig().lr == 1e-3
    source = (ROOT / "minibert" / "cli" / "pretrain.py").read_text()
    assert not re.search(r"\blr=", source.split("MAIN_JOB = ")[1].split("\n\n")[0])
    assert (finetune.FINETUNE.train.lr, finetune.FINETUNE.lr_init_from) == (5e-4, 1e-4)


@pytest.mark.parametrize("script", sorted(FINETUNE_REQUIRED))
def test_finetuning_defaults_are_the_preset(script):
    module = load_example(script)
    job = getattr(module, "JOB", finetune.FINETUNE)
    args = module.parse_args(FINETUNE_REQUIRED[script])
    # The run's length and its evaluations are counted in epochs (here of one step each).
    assert _differs(finetune.train_config(args, steps_per_epoch=1), job.train) == {
        "max_steps": (job.epochs, job.train.max_steps),
        "eval_every": (1, job.train.eval_every), "save_every": (1, job.train.save_every)}
    assert (args.epochs, args.seq_len, args.preset, args.vocab_size, args.keep_freed_memory
            ) == (job.epochs, job.seq_len, job.preset, job.vocab_size, job.keep_freed_memory)
    assert finetune.dropout_rate(args) == job.dropout
    from_checkpoint = module.parse_args(FINETUNE_REQUIRED[script] + ["--init-from", "m"])
    assert finetune.learning_rate(from_checkpoint) == job.lr_init_from
    assert finetune.dropout_rate(from_checkpoint) == job.dropout_init_from


def test_flag_names_name_every_field():
    for job, warmup in ((pretrain.MAIN_JOB, "--warmup-steps"),
                        (finetune.FINETUNE, "--warmup-ratio")):
        assert job.flags().keys() == job.train.flat().keys()
        assert job.flags()["warmup"] == warmup


def _declared(path: Path) -> list[str]:
    """The option strings `path` declares: literal first arguments of `add_argument` (or of
    a name bound to it, e.g. `arg = group.add_argument`)."""
    tree = ast.parse(path.read_text())
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Attribute) and node.value.attr == "add_argument"
               for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if ((isinstance(func, ast.Attribute) and func.attr == "add_argument")
                or (isinstance(func, ast.Name) and func.id in aliases)):
            first = node.args[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                found.append(first.value)
    return found


def test_no_flag_is_declared_twice():
    files = [path for path in sorted((ROOT / "minibert").rglob("*.py"))
             + sorted((ROOT / "examples").glob("*.py")) if path.name not in SCORERS]
    declared = Counter(flag for path in files for flag in _declared(path))
    shared = cli.flag_specs(pretrain.MAIN_JOB).keys()
    assert not shared & declared.keys(), "declared beside cli.flag_specs"
    twice = {flag for flag, n in declared.items() if n > 1}
    assert twice <= OWN_MEANING, twice - OWN_MEANING
    assert declared["--mask-prob"] == 1 and declared["--seq-len-warmup"] == 1
    # the scorers' own flags mean their own things; the plain ones they share, they take from cli
    for name in SCORERS:
        assert not set(_declared(ROOT / "examples" / name)) & cli.PLAIN_FLAGS.keys(), name


def test_every_shared_flag_is_used():
    """No flag_specs entry is dead: each is added by some script."""
    used = set()
    for script in ("pretrain_wikitext", *FINETUNE_REQUIRED):
        parser_args = FINETUNE_REQUIRED.get(script, [])
        module = load_example(script)
        args = module.parse_args(parser_args)
        used |= {"--" + name.replace("_", "-") for name in vars(args)}
    assert set(cli.flag_specs(pretrain.MAIN_JOB)) <= used | {"--warmup-ratio", "--epochs"}


# ---- every flag of every script: its help, and the same negative forms ---------------------

SCRIPTS = sorted(path.stem for path in (ROOT / "examples").glob("*.py"))


class _Built(Exception):
    """Raised in place of parsing, carrying the parser a script's parse_args built."""

    def __init__(self, parser):
        self.parser = parser


def _parser(script: str, monkeypatch):
    """The parser `script`'s parse_args builds, caught as it would start parsing (so no
    required flag needs a value, and nothing after the parse runs)."""
    import argparse

    def caught(parser, *args, **kwargs):
        raise _Built(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    with pytest.raises(_Built) as built:
        load_example(script).parse_args([])
    return built.value.parser


def test_every_script_is_walked():
    assert {"pretrain_wikitext", "distill", "glue", "embed", "blimp",
            *FINETUNE_REQUIRED} == set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_says_what_it_does(script, monkeypatch):
    """--help gives each flag a line of its own words, not only "(default: ...)", which the
    formatter writes for a flag without help."""
    import argparse

    parser = _parser(script, monkeypatch)
    bare = [", ".join(a.option_strings) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)
            and (a.help is None or a.help == argparse.SUPPRESS or not a.help.strip()
                 or a.help.strip().startswith("(default"))]
    assert not bare, f"{script}: flags without help: {bare}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_help_names_only_the_scripts_own_flags(script, monkeypatch):
    """A help that points to another flag points to one the script has (distill.py's spoke of
    --init-from, which only the main job and the fine-tuning scripts take)."""
    import argparse
    import re

    parser = _parser(script, monkeypatch)
    own = set(parser._option_string_actions)
    named = {flag: a.option_strings[0] for a in parser._actions
             if a.help and a.help != argparse.SUPPRESS
             for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", a.help)}
    assert {f: where for f, where in named.items() if f not in own} == {}


@pytest.mark.parametrize("script", SCRIPTS)
def test_keep_freed_memory_has_both_forms_wherever_it_is(script, monkeypatch):
    """--keep-freed-memory / --no-keep-freed-memory in every script that has the flag, each
    script keeping its default (on a CPU for pretraining: None; off for fine-tuning)."""
    parser = _parser(script, monkeypatch)
    if "--keep-freed-memory" not in parser._option_string_actions:
        pytest.skip(f"{script} has no --keep-freed-memory")
    monkeypatch.undo()  # parse for real
    module = load_example(script)
    required = FINETUNE_REQUIRED.get(script) or (["--teacher", "t"] if script == "distill"
                                                 else [])
    default = module.parse_args(required).keep_freed_memory
    assert default == (None if script in ("pretrain_wikitext", "distill") else False)
    assert module.parse_args(required + ["--keep-freed-memory"]).keep_freed_memory is True
    assert module.parse_args(required + ["--no-keep-freed-memory"]).keep_freed_memory is False


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_path_flag_expands_a_tilde_and_refuses_an_empty_path(script, monkeypatch,
                                                                     tmp_path, capsys):
    """`--out=~/run`: the shell leaves a `~` after `=` as it is, and the run went into
    ./~/run. An empty path would be the current folder, which nobody means by it."""
    parser = _parser(script, monkeypatch)
    paths = [a for a in parser._actions if a.type in (Path, getattr(cli, "path_flag", Path))]
    required = [x for a in parser._actions if a.required for x in (a.option_strings[0], "x")]
    monkeypatch.undo()  # parse for real
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths
    module = load_example(script)
    for action in paths:
        flag = action.option_strings[0]
        args = module.parse_args([*required, f"{flag}=~/run"])
        assert getattr(args, action.dest) == tmp_path / "run", flag
        with pytest.raises(SystemExit) as e:
            module.parse_args([*required, flag, ""])
        assert e.value.code == 2
        assert_carries(capsys.readouterr().err, flag, "empty")


def test_a_task_s_files_expand_a_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("t.tsv", "e.tsv"):
        (tmp_path / name).write_text("text\tlabel\na\tb\n")
    tasks = load_example("finetune_multitask").parse_tasks(["a:sequence:~/t.tsv:~/e.tsv"])
    assert (tasks[0]["train_file"], tasks[0]["eval_file"]) == (tmp_path / "t.tsv",
                                                               tmp_path / "e.tsv")
