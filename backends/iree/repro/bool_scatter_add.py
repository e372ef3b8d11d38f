"""scatter_add on bool wraps: True + True is False in IREE (an i1 add), True in eager."""

import torch

from iree_alone import compare

index = torch.tensor([0, 0, 1, 1])
compare(
    "scatter_add of four Trues into two slots, bool",
    lambda x, i, src: x.scatter_add(0, i, src),
    torch.zeros(2, dtype=torch.bool),
    index,
    torch.ones(4, dtype=torch.bool),
)
