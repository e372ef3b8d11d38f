"""atan2(0, 0) is nan in IREE; eager (and C's atan2) give 0."""

import torch

from iree_alone import compare

compare("atan2(0, 0), float32", torch.atan2, torch.zeros(3), torch.zeros(3))
