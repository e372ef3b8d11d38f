"""float16 linear rounds the matrix product to float16 before adding the bias in IREE; eager rounds once.

With x @ w.T = 1000.25 (exact in float32) and bias -1000, eager gives 0.25;
rounding the product to float16 first (1000.0) loses the quarter.
"""

import torch

from iree_alone import compare

x = torch.tensor([[500.0, 0.25]], dtype=torch.float16)
w = torch.tensor([[2.0, 1.0]], dtype=torch.float16)  # x @ w.T = 1000.25
b = torch.tensor([-1000.0], dtype=torch.float16)
compare("linear(x, w, b) = 1000.25 - 1000, float16", torch.nn.functional.linear, x, w, b)
