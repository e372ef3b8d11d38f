"""The published contract (pytest_backendconf/backend.py): the protocols fit the bundled backends, the
fault-injection helper reads and rejects what it should, and importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest
from backendconf_reference import ReferenceBackend

import pytest_backendconf as bc
from pytest_backendconf.backend import FAULT_KEY, DeclaresCapabilities, ExplainsUnavailability, fault_node_name


def test_the_reference_backend_fits_every_protocol() -> None:
    backend = ReferenceBackend()
    assert isinstance(backend, bc.Backend)
    assert isinstance(backend, DeclaresCapabilities)
    assert isinstance(backend, ExplainsUnavailability)


def test_an_object_without_the_hooks_is_not_a_backend() -> None:
    class NoExecute:
        name = "x"

        def is_available(self) -> bool:
            return True

        def preprocess(self, program, compile_spec, debug_handles):  # type: ignore[no-untyped-def]
            return b""

        def compile(self, processed, method_compile_spec):  # type: ignore[no-untyped-def]
            return {}

    assert not isinstance(NoExecute(), bc.Backend)
    assert not isinstance(NoExecute(), ExplainsUnavailability)


def test_fault_node_name_reads_the_key() -> None:
    assert fault_node_name({}) is None
    assert fault_node_name({FAULT_KEY: {"node": "mul_1"}}) == "mul_1"


@pytest.mark.parametrize("value", ["mul", {"node": 3}, {"node": "mul", "extra": 1}, {}])
def test_a_malformed_fault_key_names_the_key_and_the_shape(value: object) -> None:
    with pytest.raises(
        ValueError, match=r"compile-spec key '__backendconf_fault__' must be \{'node': '<FX node name>'\}"
    ):
        fault_node_name({FAULT_KEY: value})


def test_importing_the_contract_does_not_import_torch() -> None:
    code = "import sys, pytest_backendconf.backend; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
