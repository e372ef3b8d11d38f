"""A bfloat16 program with a constant fails to compile: 'arith.constant' op failed to verify."""

import torch

from iree_alone import compare

weights = torch.tensor([1.5, 2.5, 3.5], dtype=torch.bfloat16)
compare("x * constant, bfloat16", lambda x: x * weights, torch.rand(3).bfloat16())
