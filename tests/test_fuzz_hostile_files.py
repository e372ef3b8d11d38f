"""A bounded, seeded fuzz of every file the project reads: only the documented error types come out.

Archives, debug sidecars, reports, known-failures files and preprocess-cache entries are mutated (bit
flips, truncations, splices of one part into another, JSON values replaced by
hostile ones), with hashes, sizes and CRCs recomputed where the format has
them so that the *content* is what is hostile, and handed to their readers.
Each reader either accepts the file or raises the error type docs/security.md
documents for it; anything else (a KeyError, a RecursionError, a crash) fails
the test with the seed and the mutation that found it. Fixed seeds and counts
keep it deterministic and within seconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any, Callable

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.cli._main import main
from pytest_backendconf.errors import ArchiveError, BackendContractError
from pytest_backendconf.report._known_failures import KnownFailureIndex, load_known_failures

from test_archive import entries_of
from test_archive_hostile import honest
from test_report_merge import SMALL_CNN, make_report

SEED = 41
HOSTILE_STRINGS = ['"""', "\n\r\x00", "\u2028", "`|]]>", "\ud800", "a" * 5000, "../../etc/passwd", "[[", "${x}"]


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


# --- mutations --------------------------------------------------------------------------------------


def mutate_bytes(rng: random.Random, data: bytes, other: bytes) -> tuple[str, bytes]:
    """One byte-level mutation of ``data``: a bit flip, a truncation, or a splice of ``other`` into it."""
    if not data:
        return "splice into empty", other[: rng.randint(0, 64)]
    kind = rng.choice(("flip", "flip", "truncate", "splice", "repeat"))
    if kind == "flip":
        i = rng.randrange(len(data))
        return f"flip bit at {i}", data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    if kind == "truncate":
        n = rng.randrange(len(data))
        return f"truncate to {n}", data[:n]
    i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    if kind == "repeat":
        return f"repeat [{i}:{j}]", data[:j] + data[i:j] * rng.randint(1, 50) + data[j:]
    a = rng.randrange(len(other) + 1)
    return f"splice other[{a}:] at {i}", data[:i] + other[a : a + rng.randint(1, 256)] + data[j:]


def hostile_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            -1,
            2**63,
            10**400 // 10**390,
            1.5,
            math.inf,
            math.nan,
            rng.choice(HOSTILE_STRINGS),
            [],
            {},
            [[[[[[[[[[1]]]]]]]]]],
            {"$input": 10**9},
            list(range(rng.randint(0, 3000))),
            {"__class__": "os.system"},
        ]
    )


def mutate_json(rng: random.Random, document: Any) -> tuple[str, Any]:
    """Replace one value somewhere in ``document`` (a copy) by a hostile one, or delete a key or an item."""
    document = json.loads(json.dumps(document))
    path: list[Any] = []
    node = document
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        if not isinstance(node[key], (dict, list)) or not node[key] or rng.random() < 0.25:
            break
        path.append(key)
        node = node[key]
    if not isinstance(node, (dict, list)) or not node:
        return "replace the whole document", hostile_value(rng)
    key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
    if rng.random() < 0.2:
        del node[key]
        return f"delete {path + [key]}", document
    value = hostile_value(rng)
    node[key] = value
    return f"set {path + [key]} to {json.dumps(value)[:40]}", document


def expect_only(allowed: tuple[type[BaseException], ...], what: str, run: Callable[[], Any]) -> None:
    try:
        run()
    except allowed:
        pass
    except Exception as exc:
        pytest.fail(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


# --- archives and sidecars ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    x = torch.randn(2, 3)
    lowered = bc.to_backend(Small().eval(), "reference", {"forward": {}}, example_inputs=(x,))
    path = folder / "small.bcpt"
    bc.save(lowered, path)
    apart = folder / "apart.bcpt"
    bc.save(lowered, apart, debug_info="separate")
    return path.read_bytes(), (folder / "apart.bcpt.debug").read_bytes()


def test_mutated_archives_give_archive_errors_only(saved, tmp_path):
    archive, _ = saved
    entries = entries_of(archive)
    names = sorted(entries)
    rng = random.Random(SEED)
    for round in range(160):
        name = rng.choice(names)
        changed = dict(entries)
        if name.endswith(".json") and rng.random() < 0.6:
            how, document = mutate_json(rng, json.loads(entries[name]))
            changed[name] = json.dumps(document).encode()
        else:
            how, changed[name] = mutate_bytes(rng, entries[name], entries[rng.choice(names)])
        try:
            data = honest(changed)  # sizes, hashes and CRCs recomputed: only the content is hostile
        except (ValueError, TypeError, AttributeError):
            how, data = f"{how}, hashes as they were", mutate_bytes(rng, archive, archive)[1]
        what = f"seed {SEED} round {round}: {name}: {how}"
        expect_only((ArchiveError,), what, lambda: bc.read_archive(data))
        expect_only((ArchiveError,), what, lambda: bc.symbolicate(data, [0, 1, 2, 3]))
        # A blob that decodes but that the backend's compile() refuses is its own documented error.
        expect_only((ArchiveError, BackendContractError), what, lambda: bc.load(data))


def test_mutated_debug_sidecars_give_archive_errors_only(saved, tmp_path):
    archive, sidecar = saved
    rng = random.Random(SEED + 1)
    path = tmp_path / "apart.bcpt.debug"
    entries = entries_of(sidecar)
    for round in range(80):
        name = rng.choice(sorted(entries))
        if rng.random() < 0.5:
            how, data = mutate_bytes(rng, sidecar, archive)
        else:
            changed = dict(entries)
            if name.endswith(".json"):
                how, document = mutate_json(rng, json.loads(entries[name]))
                changed[name] = json.dumps(document).encode()
            else:
                how, changed[name] = mutate_bytes(rng, entries[name], archive)
            try:
                data = honest(changed, deflated=frozenset())
            except (ValueError, TypeError, AttributeError):
                how, data = f"{how}, hashes as they were", mutate_bytes(rng, sidecar, sidecar)[1]
        path.write_bytes(data)
        what = f"seed {SEED + 1} round {round}: {name}: {how}"
        expect_only((ArchiveError,), what, lambda: bc.symbolicate(path, [0, 1, 2]))


# --- reports and known-failures files -------------------------------------------------------------------


def test_mutated_reports_end_in_a_report_error_or_a_page(tmp_path, capsys):
    base = make_report(outcomes={SMALL_CNN: "failed", "backendconf::ops::aten.add.Tensor[float32-sample0]": "passed"})
    good = tmp_path / "good.json"
    good.write_text(json.dumps(base))
    rng = random.Random(SEED + 2)
    path = tmp_path / "report.json"
    for round in range(50):
        if rng.random() < 0.7:
            how, document = mutate_json(rng, base)
            path.write_text(json.dumps(document))
        else:
            how, data = mutate_bytes(rng, good.read_bytes(), b'{"tests": [[[[' + "\u2028".encode())
            path.write_bytes(data)
        what = f"seed {SEED + 2} round {round}: {how}"
        for command in (
            ["report", "html", str(path), "-o", str(tmp_path / "page.html")],
            ["report", "merge", str(good), str(path), "--markdown", str(tmp_path / "m.md")],
            ["report", "known-failures", str(path), "-o", str(tmp_path / "known.toml")],
            ["report", "ops", str(path)],
            ["report", "gate", str(path)],
            ["report", "gate", str(path), f"--known-failures={tmp_path / 'known.toml'}"],
        ):
            # main turns every documented error into an exit status; anything else escapes as an exception.
            expect_only((), f"{what}: {' '.join(command[:2])}", lambda: main(command))
        capsys.readouterr()


def test_mutated_known_failures_files_end_in_a_usage_error_or_entries(tmp_path):
    text = (
        b'"backendconf::parity::small_cnn[float16]" = { reason = "tolerance", link = "https://x/1" }\n'
        b'"backendconf::ops::aten.add*[float16-*]" = { reason = "half" }\n'
        b"'parity::*' = { reason = \"literal key\" }\n"
    )
    extra = b'[[x]]\n"""\n[a.b]\nk = [[[[[[1]]]]]]\n' + "\u2028\x00".encode()
    rng = random.Random(SEED + 3)
    path = tmp_path / "known.toml"
    ids = ["backendconf::parity::small_cnn[float16]", "backendconf::ops::aten.add.Tensor[float16-sample0]"]
    for round in range(300):
        how, data = mutate_bytes(rng, text, extra)
        path.write_bytes(data)
        what = f"seed {SEED + 3} round {round}: {how}"

        def read() -> None:
            index = KnownFailureIndex(load_known_failures(path, "--backendconf-known-failures"))
            for test_id in ids:
                index.matching(test_id)

        expect_only((pytest.UsageError,), what, read)


# --- preprocess cache entries ---------------------------------------------------------------------------


def test_mutated_cache_entries_are_misses_never_errors_or_other_bytes(tmp_path):
    """An entry's bytes, manifest or blob mutated (sizes, SHA-256 and CRCs recomputed), its MAC kept as it
    was, made under another secret, or dropped: the cache's ``get`` returns the stored blob or nothing."""
    from backendconf_reference import ReferenceBackend

    from pytest_backendconf.archive import encode_cache_entry, entry_mac, pack
    from pytest_backendconf.lowering import PreprocessCache

    secret = b"the user's secret, outside the folder"
    cache = PreprocessCache(tmp_path / "cache", ReferenceBackend(), "1.0", 2**20, secret=secret)
    cache.prepare()
    key = "a" * 64
    blob = bytes(range(256)) * 4
    good = encode_cache_entry(key, blob, secret)
    manifest = json.loads(entries_of(good)["manifest.json"])
    path = tmp_path / "cache" / f"{key}.bcpc"
    rng = random.Random(SEED + 5)
    for round in range(200):
        new_blob, changed = blob, dict(manifest)
        if rng.random() < 0.3:
            how, data = mutate_bytes(rng, good, blob)
        else:
            if rng.random() < 0.5:
                how, changed = mutate_json(rng, manifest)
            else:
                how, new_blob = mutate_bytes(rng, blob, good)
            if isinstance(changed, dict):  # an honest record of the blob: only the content is hostile
                changed = {**changed, "blob": {"sha256": hashlib.sha256(new_blob).hexdigest(), "size": len(new_blob)}}
                mac = rng.choice(("kept", "another secret's", "dropped"))
                how += f", MAC {mac}"
                if mac == "another secret's":
                    changed["mac"] = entry_mac(b"a guess at the secret", key, new_blob)
                elif mac == "dropped":
                    changed.pop("mac", None)
            data = pack([("manifest.json", json.dumps(changed).encode()), ("blob.bin", new_blob)])
        path.write_bytes(data)
        what = f"seed {SEED + 5} round {round}: {how}"

        def get() -> None:
            got = cache.get(key)
            assert got is None or got == blob, f"{what}: a hit with other bytes"

        expect_only((), what, get)
    assert cache.counts["hits"] + cache.counts["misses"] == 200
    assert cache.counts["refused"] > 20 and cache.counts["removed"] > 20, cache.counts  # both refusals exercised
