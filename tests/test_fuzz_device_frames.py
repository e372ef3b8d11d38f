"""A bounded, seeded fuzz of the frames a device sends: the link is dropped as TargetUnreachable, or they are taken.

The frames of a replay on a device (``hello``, ``ready``, a worker's records
with a bundle's outputs, its stderr, ``pong``, ``ended``) are mutated as
tests/test_fuzz_hostile_files.py mutates files (JSON values replaced by
hostile ones, keys deleted, bit flips, truncations, splices, repeats, lines
longer than the cap) and written through a real pipe to `TargetLink.read`,
the reader the link's thread runs on the device's stdout. Each round ends
with the pipe, so a hang fails the round's timeout; the reader either takes
every frame or drops the link with a reason that is bounded and printable.
The worker on the link then ends as the device said or as unreachable, and
the bundle answers it received get the host's verdicts (`judge_answers`):
one per bundle of the archive, never another exception. A reader with a
small cap is used, so that a line over it costs little; the cap holds
whatever the line's length (`test_a_line_over_the_cap_is_read_no_further`).
"""

from __future__ import annotations

import json
import os
import random
import threading
import tracemalloc
from typing import Any

import pytest
import torch

import pytest_backendconf as bc
from pytest_backendconf.target import DeviceChild, Ended, TargetLink, pack_value, versions
from pytest_backendconf.target._replay import judge_answers

from test_fuzz_hostile_files import Small, mutate_bytes, mutate_json

SEED = 56
#: The reader's cap in this fuzz (the real one is `MAX_FRAME_BYTES`).
CAP = 64 * 1024
ECHO = "pytest_backendconf.target._child:Echo"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """An archive with two bundles, and the frames an honest device sends while replaying it."""
    path = tmp_path_factory.mktemp("frames") / "small.bcpt"
    model = Small().eval()
    xs = [torch.randn(2, 3), torch.randn(4, 3)]
    bc.save(
        bc.to_backend(model, "reference", {"forward": {}}, example_inputs=(xs[0],)),
        path,
        bundled_inputs={"forward": [(x,) for x in xs]},
        eager=model,
    )
    bundles = bc.read_archive(path).bundles
    with torch.no_grad():
        outputs = [model(x) for x in xs]
    frames: list[dict[str, Any]] = [
        {"kind": "hello", "protocol": 1, "machine": "x86_64", "pid": 4242, **versions()},
        {"kind": "pong", "id": 0},
        {"kind": "ready", "torch": torch.__version__},
        {"w": 1, "r": {"kind": "ready", "pid": 4243}},
        {"kind": "stderr", "w": 1, "data": "UserWarning: \x1b[31mnumpy\x1b[0m\n"},
    ]
    for index, out in enumerate(outputs):
        answer = {"kind": "bundle", "method": "forward", "index": index, "outputs": pack_value(out, "outputs")}
        frames.append({"w": 1, "r": answer})
    frames += [
        {"w": 1, "r": {"kind": "result", "error": None}},
        {"kind": "ended", "w": 1, "returncode": 0, "killed": False},
    ]
    return str(path), bundles, frames


def encode(frames: list[Any]) -> bytes:
    return b"".join(json.dumps(f).encode() + b"\n" for f in frames)


def mutated(rng: random.Random, frames: list[dict[str, Any]]) -> tuple[str, bytes]:
    """One mutation of the exchange: a frame's JSON, the stream's bytes, or a line over the cap."""
    roll = rng.random()
    if roll < 0.55:
        n = rng.randrange(len(frames))
        how, frame = mutate_json(rng, frames[n])
        changed = [*frames[:n], frame, *frames[n + 1 :]]
        return f"frame {n}: {how}", encode(changed)
    if roll < 0.9:
        data = encode(frames)
        return mutate_bytes(rng, data, b'{"w": 1, "r": [[[[' + b"\xff\xfe\x00\n")
    n = rng.randrange(len(frames) + 1)
    long = b"x" * rng.choice((CAP - 1, CAP, CAP + 1, 3 * CAP)) + (b"\n" if rng.random() < 0.5 else b"")
    return f"a line of {len(long)} bytes before frame {n}", encode(frames[:n]) + long + encode(frames[n:])


def feed(link: TargetLink, data: bytes) -> None:
    """``data`` through a real pipe to the link's reader, as a device's stdout would bring it."""
    read, write = os.pipe()

    def writer() -> None:
        with open(write, "wb") as stream:
            try:
                stream.write(data)
            except BrokenPipeError:
                pass  # the reader dropped the link and stopped reading

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with open(read, "rb") as stream:
        link.read(stream)
    thread.join(30)
    assert not thread.is_alive()


def test_mutated_frames_are_taken_or_drop_the_link(replayed):
    path, bundles, frames = replayed
    rng = random.Random(SEED)
    outcomes = {"taken": 0, "dropped": 0}
    for round in range(300):
        how, data = mutated(rng, frames)
        what = f"seed {SEED} round {round}: {how}"
        link = TargetLink("fuzzed device", max_frame=CAP)
        worker = link.child(ECHO, plugins=[])
        assert isinstance(worker, DeviceChild)
        try:
            feed(link, data)
        except Exception as exc:
            pytest.fail(f"{what}: the reader raised {type(exc).__name__}: {str(exc)[:300]}")
        if link.broken is not None:
            outcomes["dropped"] += 1
            reason = link.lost or ""
            assert reason.startswith("the device broke the runner protocol: it "), what
            assert reason.isprintable() and len(reason) < 600, f"{what}: {reason!r}"
        else:
            outcomes["taken"] += 1
        link.drop("the fuzzed stream ended")  # what the reader thread does when the device's stdout ends
        answers = []
        while True:
            record = worker.receive(0)
            if isinstance(record, Ended):
                break
            if record is not None:
                answers.append(record)
        # As the device said it ended (before its stream broke, if it did), or unreachable.
        assert record.unreachable or record.crashed or record.setup_error is not None, what
        try:
            results = judge_answers(path, bundles, answers, "reference")
        except Exception as exc:
            pytest.fail(f"{what}: judging the answers raised {type(exc).__name__}: {str(exc)[:300]}")
        assert [(r.method, r.index) for r in results[:2]] == [("forward", 0), ("forward", 1)], what
    # Both ends are reached: the fuzz is not all refusals, nor all harmless.
    assert outcomes["taken"] > 30 and outcomes["dropped"] > 30, outcomes


def test_honest_frames_are_taken_and_pass(replayed):
    path, bundles, frames = replayed
    link = TargetLink("honest device", max_frame=CAP)
    worker = link.child(ECHO, plugins=[])
    feed(link, encode(frames))
    assert link.broken is None and link.hello is not None and link.hello["machine"] == "x86_64"
    link.drop("the stream ended")
    records = []
    while not isinstance(record := worker.receive(0), Ended):
        records.append(record)
    assert [r["kind"] for r in records] == ["bundle", "bundle", "result"]
    assert [r.outcome for r in judge_answers(path, bundles, records, "reference")] == ["passed", "passed"]
    assert "numpy" in worker.stderr()


def test_a_line_over_the_cap_is_read_no_further():
    endless = b'{"kind": "hello", "machine": "' + b"x" * (64 * CAP)
    link = TargetLink("endless device", max_frame=CAP)
    tracemalloc.start()
    try:
        feed(link, endless)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert link.broken == f"sent a frame longer than {CAP:,} bytes, the cap on a frame (docs/security.md)"
    assert peak < 3 * CAP, peak  # the line read up to the cap, not the 4 MiB the device sent
