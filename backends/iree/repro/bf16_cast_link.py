"""A bfloat16 adaptive average pool does not link on the generic CPU: IREE calls compiler-rt's __truncsfbf2.

(The suite's pools and dtype_casts models in bfloat16 fail the same way.)
"""

import torch

from iree_alone import compare

compare(
    "adaptive_avg_pool2d(x, [5, 7]) of a bfloat16 x",
    lambda x: torch.nn.functional.adaptive_avg_pool2d(x, [5, 7]),
    torch.rand(1, 3, 8, 8).bfloat16(),
)
