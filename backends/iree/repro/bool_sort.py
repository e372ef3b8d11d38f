"""sort of a bool tensor comes out inverted in IREE (Trues first)."""

import torch

from iree_alone import compare

compare("sort([True, False, True, False]), bool", lambda x: torch.sort(x)[0], torch.tensor([True, False, True, False]))
