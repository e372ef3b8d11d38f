"""index_copy past a cache's end: eager raises IndexError; IREE writes outside the buffer.

A static KV cache of 16 positions, written at position 16 (one past its end),
the position fed at run time as a decoder feeds it. IREE's scatter has no
bounds check: the write lands outside the cache's buffer and corrupts the
heap, and the process aborts ("double free or corruption (!prev)" here)
instead of returning an error. Run it in a shell of its own.
"""

import torch

from iree_alone import run

cache = torch.zeros(16, 64)
row = torch.ones(1, 64)
position = torch.tensor([16])


def write(cache, position, row):
    return cache.index_copy(0, position, row).sum()


print("== index_copy of one row at position 16 of a 16-row cache, float32", flush=True)
try:
    print(f"eager: {write(cache, position, row)}", flush=True)
except IndexError as exc:
    print(f"eager: IndexError: {exc}", flush=True)
print(f"IREE:  {run(write, cache, position, row)[0]}", flush=True)
