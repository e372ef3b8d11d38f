"""log10 does not link on the generic CPU: IREE calls libm's log10f, which its runtime library lacks."""

import torch

from iree_alone import compare

compare("log10, float32", torch.log10, torch.rand(4) + 1)
