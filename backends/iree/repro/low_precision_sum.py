"""float16 and bfloat16 reductions accumulate in the low-precision type in IREE; eager accumulates in float32.

The sum of 4096 copies of 0.1 in float16 is 409.5 in eager (float32
accumulation, one rounding); accumulated in float16 it stops growing once
0.1 is less than half an ulp of the running sum.
"""

import torch

from iree_alone import compare

compare("sum of 4096 x 0.1, float16", lambda x: x.sum(), torch.full((4096,), 0.1, dtype=torch.float16))
compare("sum of 4096 x 0.1, bfloat16", lambda x: x.sum(), torch.full((4096,), 0.1, dtype=torch.bfloat16))
