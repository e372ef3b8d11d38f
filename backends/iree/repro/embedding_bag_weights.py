"""embedding_bag ignores per_sample_weights in IREE: mode sum adds the rows unweighted."""

import torch

from iree_alone import compare

table = torch.arange(12.0).reshape(4, 3)
compare(
    "embedding_bag(mode='sum', per_sample_weights=[0.5, 2, 0, 1]), float32",
    lambda t, i, o, w: torch.nn.functional.embedding_bag(i, t, o, mode="sum", per_sample_weights=w),
    table,
    torch.tensor([0, 1, 2, 3]),
    torch.tensor([0, 2]),
    torch.tensor([0.5, 2.0, 0.0, 1.0]),
)
