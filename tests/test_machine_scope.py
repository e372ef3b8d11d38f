"""Known failures scoped to machines: the report names the machine, and an entry's ``when`` says where it applies.

Float kernels pick their instructions at run time (XNNPACK's float16 GEMMs accumulate in float16 with
AVX512-FP16 and in float32 with F16C), so one known-failures file serves a fleet only if an entry can
say on which machines its check fails. Elsewhere the entry is not applied and the check must pass.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from pytest_backendconf.report import applies, describe_machine, machine_line
from pytest_backendconf.report._known_failures import format_known_failures, load_known_failures
from pytest_backendconf.report._machine import cpu_info

from test_gating import AVAILABLE, LINEAR, expect, select, suite, write  # noqa: F401  (the suite fixture)

X86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx f16c avx2 fma avx512f avx512_fp16 ht\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimdhp sve bf16 i8mm\nCPU part\t: 0xd0c\n"


def test_cpu_info_keeps_the_flags_that_change_kernels_on_x86_and_arm():
    assert cpu_info(X86) == ("AMD EPYC", ["avx", "avx2", "avx512_fp16", "avx512f", "f16c", "fma"])
    assert cpu_info(ARM) == ("0xd0c", ["asimd", "asimdhp", "bf16", "i8mm", "sve"])


def test_this_machine_is_described_in_the_report_vocabulary():
    machine = describe_machine()
    assert set(machine) == {"machine", "cpu_model", "cpu_capability", "cpu_flags"}
    assert machine["machine"] and isinstance(machine["cpu_flags"], list)
    assert machine["machine"] in machine_line(machine)


def test_an_entry_applies_only_where_every_condition_holds():
    fp16 = {"machine": "x86_64", "cpu_capability": "AVX512", "cpu_flags": ["avx2", "avx512_fp16"]}
    avx2 = {"machine": "x86_64", "cpu_capability": "AVX2", "cpu_flags": ["avx2", "f16c"]}
    assert applies({}, avx2)
    assert applies({"cpu_flags": ("avx512_fp16",)}, fp16) and not applies({"cpu_flags": ("avx512_fp16",)}, avx2)
    assert applies({"machine": "x86_64", "cpu_capability": "avx2"}, avx2)
    assert not applies({"machine": "aarch64"}, avx2)


def test_when_is_read_checked_and_written_back(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text('"parity::a[float16]" = { reason = "fp16 GEMM", when = { cpu_flags = ["avx512_fp16"] } }\n')
    [entry] = load_known_failures(path, "--backendconf-known-failures")
    assert entry.when == (("cpu_flags", ("avx512_fp16",)),)
    assert entry.as_json()["when"] == {"cpu_flags": ["avx512_fp16"]}
    path.write_text(format_known_failures([entry], "x"))
    assert load_known_failures(path, "--backendconf-known-failures") == [entry]


@pytest.mark.parametrize(
    ("when", "says"),
    [
        ('{ cpu = "x" }', "when has unknown key(s) 'cpu'; it may have machine, cpu_capability, cpu_flags"),
        ('{ cpu_flags = "avx2" }', "when.cpu_flags must be a non-empty list of flag names"),
        ("{ machine = 3 }", "when.machine must be a non-empty string"),
        ('"x86_64"', "when must be a table"),
    ],
)
def test_a_bad_when_is_a_usage_error_naming_the_entry_and_the_fix(tmp_path, when, says):
    path = tmp_path / "known.toml"
    path.write_text(f'"parity::a[float16]" = {{ reason = "r", when = {when} }}\n')
    with pytest.raises(pytest.UsageError, match="entry 'parity::a\\[float16\\]'") as info:
        load_known_failures(path, "--backendconf-known-failures")
    assert says in str(info.value)


def _known(pytester, when: str):
    return write(
        pytester.path / "known.toml",
        f"""
        "{LINEAR}" = {{ reason = "float64 outputs" }}
        "{AVAILABLE}" = {{ reason = "fails on another CPU only"{when} }}
        """,
    )


def test_an_entry_for_other_machines_is_not_applied_here_and_its_check_must_pass(suite, pytester):  # noqa: F811
    report = pytester.path / "report.json"
    known = _known(pytester, ', when = { cpu_flags = ["no_such_flag_here"] }')
    result = suite(
        "wrong_dtype",
        *select(LINEAR, AVAILABLE),
        f"--backendconf-known-failures={known}",
        f"--backendconf-report={report}",
    )
    result.assert_outcomes(xfailed=1, passed=1)
    assert result.ret == pytest.ExitCode.OK
    expect(result.stdout, ["backendconf: machine *", "*(1 entry; 1 scoped to other machines, not applied here*"])
    environment = json.loads(report.read_text())["environment"]
    assert environment["cpu_flags"] == describe_machine()["cpu_flags"]
    assert environment["cpu_capability"] == describe_machine()["cpu_capability"]


def test_the_same_entry_on_its_own_machine_is_a_strict_known_failure(suite, pytester):  # noqa: F811
    here = describe_machine()["machine"]
    known = _known(pytester, f', when = {{ machine = "{here}" }}')
    result = suite("wrong_dtype", *select(LINEAR, AVAILABLE), f"--backendconf-known-failures={known}")
    result.assert_outcomes(xfailed=1, failed=1)  # it applies here, and the check passes: an unexpected pass
    expect(result.stdout, [f"{AVAILABLE} passed, but it is listed as a known failure*"])


def test_writing_the_file_keeps_the_entries_for_other_machines(suite, pytester):  # noqa: F811
    known = _known(pytester, ', when = { cpu_flags = ["no_such_flag_here"] }')
    result = suite("wrong_dtype", *select(LINEAR, AVAILABLE), f"--backendconf-write-known-failures={known}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # writing a file does not apply it: the failure shows
    text = known.read_text()
    assert textwrap.dedent('when = { cpu_flags = ["no_such_flag_here"] }') in text
    assert LINEAR in text
