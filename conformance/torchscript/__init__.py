"""The suite's TorchScript form: the categories' checks for a backend behind ``torch._C._jit_to_backend``."""

from ._category import checks

__all__ = ["checks"]
