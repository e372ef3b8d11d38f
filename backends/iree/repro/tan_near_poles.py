"""float32 tan near its poles is off in IREE; eager is exact to an ulp."""

import torch

from iree_alone import compare

x = torch.tensor([1.5707, 1.5707963, -1.5707, 4.712388, 7.8539815])
truth = torch.tan(x.double())
compare("tan near pi/2 + k pi, float32 (float64 truth below)", torch.tan, x)
print(f"truth: {truth}")
