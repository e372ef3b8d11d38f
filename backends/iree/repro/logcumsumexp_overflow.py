"""logcumsumexp overflows: IREE computes log(cumsum(exp(x))), which is inf for x = 100 in float32."""

import torch

from iree_alone import compare

compare("logcumsumexp([100, 100, 1]), float32", lambda x: torch.logcumsumexp(x, 0), torch.tensor([100.0, 100.0, 1.0]))
