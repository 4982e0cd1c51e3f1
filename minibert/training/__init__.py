"""The training engine and the run around it.

The engine a student reads, in this order:

    engine.py       `train`: the loop, read top to bottom
    settings.py     TrainConfig: the settings by concern, each group validated where declared
    state.py        TrainState (what moves), the run identity
    optim.py        AdamW with its parameter groups, and the warmup-then-decay schedule
    rng.py          seeds, and every random generator's state for an exact resume

What attaches to the loop at named points, each skippable on a first reading:

    run.py          the start (precision, resume, seeds per rank, the meter) and the result
    evaluation.py   the held-out batches and the MLM metrics over them
    checkpoint.py   checkpoints written whole or not at all, verified on load
    resume.py       where a run's checkpoints are found, and whether they continue this run
    recovery.py     what the loop does when a step goes wrong: skip it, or back off on OOM
    distributed.py  DDP through torchrun: the process group, and the collectives the loop uses
    signals.py      SIGTERM and Ctrl-C end the step in progress, save, and return
    runlog.py       metrics.jsonl, each step in it once, and the progress shown
    rundir.py       one run per folder: the lock, and what a refused start leaves
    budget.py       a run's length from a time: its step time measured once, its steps fitted

What it may import: the model, the data pipeline, the machine room and interop. Never `cli`
or `tasks`: the engine trains any module, and knows no script.
"""
