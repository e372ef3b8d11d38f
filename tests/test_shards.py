"""``--backendconf-shard=K/N``: deterministic shards that keep a model's checks together, and their merge.

The union test runs the reference backend for real (pytester, in this process) on a small selection:
unsharded, then as three shards, and compares them check by check.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pytest_backendconf.cli import main
from pytest_backendconf.suite._shards import assign, shard_group

#: A few models' checks, two operators' samples and a whole-backend check: five groups, seconds to run.
SELECTION = [
    "contract::*[[]linear]",
    "contract::*[[]small_cnn]",
    "contract::is_available_is_a_stable_bool",
    "parity::linear[[]float32]",
    "parity::small_cnn[[]float32]",
    "serialization::round_trip[[]linear]",
    "serialization::round_trip[[]small_cnn]",
    "ops::aten.add.Tensor*",
    "ops::aten.mul.Tensor*",
]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "--backend=reference",
        "-p",
        "no:cacheprovider",
        "-q",
        *(f"--backendconf-select={s}" for s in SELECTION),
        *args,
    )


def outcomes(report: Path) -> dict[str, str]:
    return {t["id"]: t["outcome"] for t in json.loads(report.read_text())["tests"]}


# --- groups and the deal -------------------------------------------------------------------------


def test_a_model_an_operator_and_the_availability_rows_are_each_one_group():
    assert shard_group("backendconf::parity::small_cnn[float16]") == "model::small_cnn"
    assert shard_group("backendconf::serialization::round_trip[small_cnn]") == "model::small_cnn"
    assert shard_group("backendconf::parity::encoder_decoder.decode[float16]") == "model::encoder_decoder"
    assert shard_group("backendconf::ops::aten.add.Tensor[float16-sample0]") == "ops::aten.add.Tensor"
    assert shard_group("backendconf::ops::aten.add.Tensor[bool-sample1]") == "ops::aten.add.Tensor"
    assert shard_group("backendconf::ops::aten.add.Tensor[int8-static-per-tensor]") == "ops::aten.add.Tensor"
    assert shard_group("backendconf::availability::a_row") == shard_group("backendconf::availability::another")
    assert shard_group("backendconf::contract::is_available_is_a_stable_bool") == (
        "contract::is_available_is_a_stable_bool"
    )
    assert shard_group("tests/test_mine.py::test_a") == shard_group("tests/test_mine.py::test_b")


def test_the_deal_is_longest_first_to_the_least_loaded_shard():
    placed = assign({"a": 5, "b": 4, "c": 3, "d": 3, "e": 3}, 2)
    # a→0, b→1, c→1 (4 < 5), d→0 (5 < 7), e→0 or 1: both 8 and 7 → 1 (7)
    assert placed == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    # Ties go by name, so the order the groups arrive in does not matter.
    weights = {f"g{i}": 1.0 for i in range(10)}
    assert assign(weights, 3) == assign(dict(reversed(list(weights.items()))), 3)
    assert sorted(assign(weights, 3).values()) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


# --- the union of the shards is the unsharded run --------------------------------------------------


@pytest.mark.slow
def test_three_shards_run_exactly_the_unsharded_checks_with_their_outcomes(pytester, tmp_path, capsys):
    pytest.importorskip("backendconf_reference")
    whole = tmp_path / "whole.json"
    done = run(pytester, f"--backendconf-report={whole}")
    assert done.ret == 0, done.stdout.str()[-3000:]
    expected = outcomes(whole)
    assert len({shard_group(i) for i in expected}) == 5 and len(expected) > 20
    assert json.loads(whole.read_text())["run"]["shard"] is None

    shards = []
    for k in (1, 2, 3):
        report = tmp_path / f"shard{k}.json"
        done = run(pytester, f"--backendconf-shard={k}/3", f"--backendconf-report={report}")
        assert done.ret == 0, done.stdout.str()[-3000:]
        got = outcomes(report)
        done.stdout.fnmatch_lines([f"backendconf: shard {k}/3: {len(got)} of {len(expected)} checks (*check counts)"])
        entry = json.loads(report.read_text())["run"]["shard"]
        assert (entry["index"], entry["count"], entry["suite_checks"]) == (k, 3, len(expected))
        assert entry["checks"] == sorted(got)
        shards.append(got)

    for i, one in enumerate(shards):
        assert one, f"shard {i + 1} ran nothing"
        for other in shards[i + 1 :]:
            assert not set(one) & set(other)  # no check in two shards
            assert not {shard_group(c) for c in one} & {shard_group(c) for c in other}  # no group split
    union = {k: v for one in shards for k, v in one.items()}
    assert union == expected  # the same ids, the same outcomes

    # Sharding again gives the same shards.
    again = tmp_path / "again.json"
    run(pytester, "--backendconf-shard=2/3", f"--backendconf-report={again}")
    assert outcomes(again).keys() == shards[1].keys()

    # The merge joins them into the unsharded run's report.
    joined = tmp_path / "joined.json"
    capsys.readouterr()
    code = main(["report", "merge", "--output", str(joined), *(str(tmp_path / f"shard{k}.json") for k in (1, 2, 3))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "joined 3 of 3 shards of backend reference" in out
    document = json.loads(joined.read_text())
    assert outcomes(joined) == expected
    assert document["summary"] == json.loads(whole.read_text())["summary"]
    assert [s["index"] for s in document["run"]["shards"]] == [1, 2, 3]
    assert document["run"]["exit_status"] == 0 and document["run"]["shard"] is None
    # The joined report is a report like any other: the HTML page reads it.
    assert main(["report", "html", str(joined), "-o", str(tmp_path / "joined.html")]) == 0
    assert "small_cnn" in (tmp_path / "joined.html").read_text()


def test_durations_of_an_earlier_report_balance_the_shards(pytester, tmp_path):
    pytest.importorskip("backendconf_reference")
    whole = tmp_path / "whole.json"
    assert run(pytester, f"--backendconf-report={whole}").ret == 0
    document = json.loads(whole.read_text())
    # Make small_cnn the one heavy model: its shard then holds it alone, the rest go to the other two.
    for test in document["tests"]:
        test["duration"] = 100.0 if shard_group(test["id"]) == "model::small_cnn" else 0.01
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(document))
    seen = {}
    for k in (1, 2, 3):
        done = run(pytester, f"--backendconf-shard={k}/3", f"--backendconf-durations={durations}", "--co")
        assert done.ret == 0, done.stdout.str()[-3000:]
        done.stdout.fnmatch_lines([f"backendconf: shard {k}/3: * checks (*balanced by durations in {durations})"])
        seen[k] = {shard_group(line) for line in done.stdout.lines if line.startswith("backendconf::")}
    assert seen[1] == {"model::small_cnn"}  # the heaviest group, first, to shard 1, and nothing else
    assert set.union(*seen.values()) == {shard_group(t["id"]) for t in document["tests"]}


@pytest.mark.slow  # two workers, each importing torch: a minute on two busy cores (`make test-slow`)
def test_under_xdist_the_workers_shard_alike_and_the_report_says_which_shard(pytester, tmp_path):
    pytest.importorskip("xdist")
    pytest.importorskip("backendconf_reference")
    serial, spread = tmp_path / "serial.json", tmp_path / "spread.json"
    assert run(pytester, "--backendconf-shard=3/3", f"--backendconf-report={serial}", "-p", "no:xdist").ret == 0
    done = run(pytester, "--backendconf-shard=3/3", f"--backendconf-report={spread}", "-n", "2", "-p", "no:randomly")
    assert done.ret == 0, done.stdout.str()[-3000:]
    assert outcomes(spread) == outcomes(serial)  # -n does not change the shard
    entry = json.loads(spread.read_text())["run"]["shard"]  # the controller, which collects nothing, has it
    assert entry == json.loads(serial.read_text())["run"]["shard"]
    done.stdout.fnmatch_lines([f"backendconf: shard 3/3: {len(entry['checks'])} of {entry['suite_checks']} checks *"])


def test_the_order_of_the_collection_does_not_change_the_shards(pytester, tmp_path):
    pytest.importorskip("backendconf_reference")
    from test_report_merge import make_report

    # Uneven durations whose sums in float depend on the order they are added in.
    durations = make_report(outcomes={})
    done = run(pytester, "--co")
    ids = [line for line in done.stdout.lines if line.startswith("backendconf::")]
    durations["tests"] = [
        {**make_report(outcomes={i: "passed"})["tests"][0], "duration": 0.1 * (n % 7)} for n, i in enumerate(ids)
    ]
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(durations))

    def shards() -> list[set[str]]:
        found = []
        for k in (1, 2, 3):
            done = run(pytester, f"--backendconf-shard={k}/3", f"--backendconf-durations={path}", "--co")
            assert done.ret == 0, done.stdout.str()[-2000:]
            found.append({line for line in done.stdout.lines if line.startswith("backendconf::")})
        return found

    before = shards()
    # Another plugin reorders the items before the shard is cut (as pytest-randomly does).
    pytester.makeconftest(
        "def pytest_collection_modifyitems(items):\n    items.reverse()\n    items[:] = items[1::2] + items[::2]\n"
    )
    assert shards() == before
    assert set.union(*before) == set(ids)


def test_a_vendors_own_tests_are_sharded_by_file(pytester):
    pytest.importorskip("backendconf_reference")
    for name in ("test_one", "test_two", "test_three"):
        pytester.makepyfile(**{name: "def test_a(): pass\ndef test_b(): pass\n"})
    ran = []
    for k in (1, 2):
        done = pytester.runpytest(
            "--backend=reference", "-p", "no:cacheprovider", "--co", "-q", ".",
            "--backendconf-select=contract::is_available_is_a_stable_bool", f"--backendconf-shard={k}/2",
        )  # fmt: skip
        assert done.ret == 0, done.stdout.str()
        ran.append({line for line in done.stdout.lines if "::" in line and not line.startswith("backendconf: ")})
    assert not ran[0] & ran[1] and len(ran[0] | ran[1]) == 7
    for shard in ran:
        files = {line.split("::")[0] for line in shard}
        for name in files - {"backendconf"}:
            assert {f"{name}::test_a", f"{name}::test_b"} <= shard  # a file's tests stay together


def test_a_shard_left_empty_is_not_a_failed_job(pytester):
    pytest.importorskip("backendconf_reference")
    done = pytester.runpytest(
        "--backend=reference", "-p", "no:cacheprovider", "-q",
        "--backendconf-select=contract::is_available_is_a_stable_bool", "--backendconf-shard=2/2",
    )  # fmt: skip
    assert done.ret == 0, done.stdout.str()
    done.stdout.fnmatch_lines(["backendconf: shard 2/2: 0 of 1 checks *"])


# --- usage errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, says",
    [
        ("0/3", "--backendconf-shard=0/3: K must be between 1 and N (the shards of 3 are 1/3 to 3/3)"),
        ("4/3", "--backendconf-shard=4/3: K must be between 1 and N (the shards of 3 are 1/3 to 3/3)"),
        ("1/0", "--backendconf-shard=1/0: K must be between 1 and N and N at least 1"),
        ("x", "--backendconf-shard=x: write K/N, the K-th of N shards counted from 1"),
        ("2", "--backendconf-shard=2: write K/N"),
    ],
)
def test_a_bad_shard_is_a_usage_error_naming_the_option_and_the_fix(pytester, value, says):
    done = pytester.runpytest("--backend=reference", f"--backendconf-shard={value}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert says in done.stderr.str()
    assert "e.g. --backendconf-shard=" in done.stderr.str()


def test_the_shard_from_the_ini_file_and_the_environment(pytester, monkeypatch):
    pytester.makeini("[pytest]\nbackendconf_shard = 5/2\n")
    done = pytester.runpytest("--backend=reference")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "backendconf_shard = '5/2' in the ini file: K must be between 1 and N" in done.stderr.str()
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("BACKENDCONF_SHARD", "three")
    done = pytester.runpytest("--backend=reference")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "$BACKENDCONF_SHARD=three: write K/N" in done.stderr.str()
    # The option wins over the variable.
    done = pytester.runpytest(
        "--backend=reference", "--backendconf-shard=1/1", "--co", "-q",
        "--backendconf-select=contract::is_available_is_a_stable_bool",
    )  # fmt: skip
    assert done.ret == 0, done.stderr.str()
    done.stdout.fnmatch_lines(["backendconf: shard 1/1: 1 of 1 checks *"])


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "cannot read report"),
        ("{not json", "is not valid JSON"),
        ('{"schema": "something else"}', "is not a backendconf report"),
    ],
)
def test_a_bad_durations_file_is_a_usage_error_naming_it(pytester, tmp_path, content, says):
    path = tmp_path / "durations.json"
    if content is not None:
        path.write_text(content)
    done = pytester.runpytest("--backend=reference", "--backendconf-shard=1/2", f"--backendconf-durations={path}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    err = done.stderr.str()
    assert f"--backendconf-durations={path}:" in err and says in err
    assert "leave the option out to balance the shards by check counts" in err


@pytest.mark.parametrize("duration", ['"slow"', "-1", "NaN", "Infinity"])
def test_a_durations_file_with_a_bad_duration_is_refused(pytester, tmp_path, duration):
    from test_report_merge import make_report

    document = make_report()
    document["tests"][0]["duration"] = "DURATION"
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(document).replace('"DURATION"', duration))
    done = pytester.runpytest("--backend=reference", "--backendconf-shard=1/2", f"--backendconf-durations={path}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert f"tests[0].duration must be a number of seconds >= 0 or null, got {duration}" in done.stderr.str()


def test_durations_without_a_shard_is_a_usage_error(pytester, tmp_path):
    done = pytester.runpytest("--backend=reference", f"--backendconf-durations={tmp_path / 'r.json'}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "--backendconf-durations balances the shards of --backendconf-shard=K/N, which is not given" in (
        done.stderr.str()
    )


# --- the merge's refusals -----------------------------------------------------------------------


def shard_reports(tmp_path: Path) -> list[dict]:
    """Three shards of one (made-up) run of six checks of three models, as a real shard run records them."""
    from test_report_merge import make_report

    from pytest_backendconf.report import shard_entry

    ids = {
        "backendconf::parity::linear[float32]": "passed",
        "backendconf::serialization::round_trip[linear]": "passed",
        "backendconf::parity::small_cnn[float32]": "passed",
        "backendconf::serialization::round_trip[small_cnn]": "failed",
        "backendconf::parity::mlp[float32]": "passed",
        "backendconf::serialization::round_trip[mlp]": "passed",
    }
    placed = assign({g: 2.0 for g in {shard_group(i) for i in ids}}, 3)
    documents = []
    for k in (1, 2, 3):
        mine = {i: o for i, o in ids.items() if placed[shard_group(i)] == k - 1}
        document = make_report(outcomes=mine)
        document["schema_version"] = [1, 5]
        document["run"]["shard"] = shard_entry(k, 3, mine, ids, "check counts")
        documents.append(document)
    return documents


def join(capsys, tmp_path, documents, *extra):
    paths = []
    for i, document in enumerate(documents):
        path = tmp_path / f"s{i}.json"
        path.write_text(json.dumps(document))
        paths.append(str(path))
    code = main(["report", "merge", "--output", str(tmp_path / "joined.json"), *extra, *paths])
    out, err = capsys.readouterr()
    return code, out, err


def test_joined_shards_with_a_failure_gate_the_run(capsys, tmp_path):
    code, out, err = join(capsys, tmp_path, shard_reports(tmp_path))
    assert code == 1, err  # a check failed: the unsharded run would have failed too
    assert "FAILED backendconf::serialization::round_trip[small_cnn]" in out
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert len(joined["tests"]) == 6 and joined["run"]["exit_status"] == 1
    assert joined["summary"]["serialization"]["failed"] == 1


def test_the_joined_run_took_as_long_as_its_longest_shard(capsys, tmp_path):
    documents = shard_reports(tmp_path)
    for document, seconds in zip(documents, (3.0, None, 7.5)):
        document["run"]["duration"] = seconds  # None: not recorded
    join(capsys, tmp_path, documents)
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert joined["run"]["duration"] == 7.5
    # A report passed around CI is data from outside: a duration that is not a number is refused, no traceback.
    documents[1]["run"]["duration"] = "slow"
    code, _, err = join(capsys, tmp_path, documents)
    assert code == 1 and 'run.duration must be a finite number or null, got "slow"' in err
    assert [s["checks"] for s in joined["run"]["shards"]] == [len(d["run"]["shard"]["checks"]) for d in documents]


def test_a_check_in_two_shards_is_refused(capsys, tmp_path):
    documents = shard_reports(tmp_path)
    twin = copy.deepcopy(documents[1])
    twin["run"]["shard"]["index"] = 3
    code, out, err = join(capsys, tmp_path, [documents[0], documents[1], twin])
    assert code == 1
    assert "ran in two shards" in err and "s1.json" in err and "s2.json" in err
    assert not (tmp_path / "joined.json").exists()


def test_shards_that_drew_different_seeds_keep_each_seed(capsys, tmp_path):
    documents = shard_reports(tmp_path)
    for k, document in enumerate(documents, 1):
        document["hypothesis"] = {"profile": "dev", "seed": 100 + k, "derandomized": False}
    join(capsys, tmp_path, documents)
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert joined["hypothesis"] == {
        "profile": "dev",
        "seed": None,
        "derandomized": False,
        "shard_seeds": [101, 102, 103],
    }


def test_one_shard_twice_is_refused(capsys, tmp_path):
    documents = shard_reports(tmp_path)
    code, out, err = join(capsys, tmp_path, [documents[0], documents[0]])
    assert code == 1
    assert "shard 1/3 is given twice" in err


@pytest.mark.parametrize(
    "where, value, says",
    [
        (("backend", "name"), "otherbackend", "are of different backends (mybackend 1.4.0 and otherbackend 1.4.0)"),
        (("environment", "torch"), "2.14.1", "are of different torch builds (2.13.0+cpu and 2.14.1)"),
        (("run", "shard", "count"), 4, "are shards of different runs (3 shards of 6 checks"),
        (("hypothesis", "profile"), "thorough", "ran different Hypothesis profiles (ci and thorough)"),
    ],
)
def test_shards_of_other_runs_are_refused(capsys, tmp_path, where, value, says):
    documents = shard_reports(tmp_path)
    target = documents[1]
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    code, out, err = join(capsys, tmp_path, documents)
    assert code == 1
    assert says in err, err


def test_a_whole_run_report_is_not_a_shard(capsys, tmp_path):
    from test_report_merge import make_report

    code, out, err = join(capsys, tmp_path, [make_report()])
    assert code == 1
    assert "is not a shard's report (its run.shard is empty)" in err


def test_the_checks_no_shard_ran_are_named(capsys, tmp_path):
    documents = shard_reports(tmp_path)
    # Shard 1 stopped before its last check; shard 3's report is not given.
    dropped = documents[0]["tests"].pop()
    code, out, err = join(capsys, tmp_path, documents[:2])
    assert code == 1, err
    assert "shard 3/3: no report given; its checks ran in no shard" in out
    assert f"{len(documents[2]['run']['shard']['checks'])} checks of the collection were in no shard given" in out
    assert "1 checks given to a shard were not run" in out and f"  {dropped['id']}" in out


def test_markdown_is_for_comparing_runs_not_for_joining_shards(capsys, tmp_path):
    code, out, err = join(capsys, tmp_path, shard_reports(tmp_path), "--markdown", str(tmp_path / "m.md"))
    assert code == 1
    assert "join each run's shards first, then merge the joined reports" in err
