"""The machine room: what makes minibert fast, and measured, on a real machine.

    kernels.py      hand-written CPU kernels, each beside the plain call it replaces and
                    proven equal to it by a test
    swap.py         `fast(model)`: those kernels swapped into a plain model from outside
                    (the scripts call it), so the textbook's forward stays plain PyTorch
    memory.py       the C allocator (glibc's free memory) and oneDNN's kernel cache
    precision.py    fp32, bf16 or fp16: what the device computes well, and autocast
    meters.py       throughput, FLOPs per token and MFU against a stated ceiling
    autotune.py     the chunked attention's tile, measured on this machine
    environment.py  what a run executes on, and the mismatches that silently cost speed
    inputs.py       the models' input checks: a wrong shape, dtype or id named, not an
                    IndexError deep in torch (or a CUDA device-side assert)

What it may import: torch, the model (its config and attention to check, count and tune
them; its classes, to swap the kernels in), the label rule and the data's cache folder.
Never the engine, the tasks or the scripts.
"""
