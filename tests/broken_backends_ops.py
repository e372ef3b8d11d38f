"""Backends for the ops category and the numerics: one defect each, or one virtue.

``WrongHalfSub`` is the reference backend with a single wrong kernel: its
``aten.sub.Tensor`` is 0.4% (plus 0.04) off in float16 and right everywhere
else, so exactly the float16 ops checks of ``aten.sub.Tensor`` and the
float16 parity checks of models with a subtraction must fail, each naming
``aten::sub``. ``AccurateHalf`` computes float16 programs in float32 and
rounds once at the end: more accurate than eager PyTorch, it must pass.
"""

from __future__ import annotations

import json

import torch
from backendconf_reference import ReferenceBackend, load
from backendconf_reference import ops as reference_ops

import pytest_backendconf as bc


def _skewed(step):
    def call(regs):
        out = step(regs)
        if isinstance(out, torch.Tensor) and out.dtype == torch.float16:
            wide = out.float()  # 0.4% and 0.04 further from zero (beyond OpInfo's atol=0.01 for sub)
            return (wide * 1.004 + torch.copysign(torch.full_like(wide, 0.04), wide)).half()
        return out

    return call


class _HalfSubChanged(ReferenceBackend):
    """The reference backend with each compiled ``aten.sub.Tensor`` step wrapped by `change`."""

    @staticmethod
    def change(step):
        raise NotImplementedError

    def compile(self, processed, method_compile_spec):
        handles = super().compile(processed, method_compile_spec)
        sub = reference_ops.BY_NAME["aten.sub.Tensor"].opcode
        for handle in handles.values():
            block = handle.main
            block.steps = tuple(
                (self.change(step) if block._instructions[out - block.n_inputs].opcode == sub else step, out)
                for step, out in block.steps
            )
        return handles


class WrongHalfSub(_HalfSubChanged):
    """``aten.sub.Tensor`` is wrong in float16 only."""

    name = "wrong_half_sub"
    change = staticmethod(_skewed)


def _no_half_kernel(step):
    def call(regs):
        out = step(regs)
        if isinstance(out, torch.Tensor) and out.dtype == torch.float16:
            raise RuntimeError("no float16 kernel for sub on this device")
        return out

    return call


class CrashingHalfSub(_HalfSubChanged):
    """``aten.sub.Tensor`` raises in float16 (its kernel's own error, which the interpreter ties to the node)."""

    name = "crashing_half_sub"
    change = staticmethod(_no_half_kernel)


class AccurateHalf(ReferenceBackend):
    """Runs float16 programs in float32 and rounds the outputs once: more accurate than eager float16."""

    name = "accurate_half"

    def preprocess(self, program, compile_spec, debug_handles):
        outputs = program.graph_module.graph.output_node().args[0]
        dtypes = [str(node.meta["val"].dtype).removeprefix("torch.") for node in outputs]
        header = json.dumps(dtypes).encode()
        return len(header).to_bytes(4, "little") + header + super().preprocess(program, compile_spec, debug_handles)

    def compile(self, processed, method_compile_spec):
        handles = {}
        for method, blob in processed.items():
            size = int.from_bytes(blob[:4], "little")
            handles[method] = (load(blob[4 + size :]), json.loads(blob[4 : 4 + size]))
        return handles

    def execute(self, handle, inputs):
        program, dtypes = handle
        wide = [x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16 else x for x in inputs]
        outputs = program.run(wide)
        for x, w in zip(inputs, wide):
            if w is not x:  # what the program writes to its inputs (batch norm's running statistics)
                x.copy_(w)  # exact for an input it left alone: float16 -> float32 -> float16
        return [o.to(getattr(torch, d)) if isinstance(o, torch.Tensor) else o for o, d in zip(outputs, dtypes)]


@bc.hookimpl
def backendconf_register_backends(register):
    register(WrongHalfSub())
    register(AccurateHalf())
