"""A device runner that lies: ``python tests/hostile_device.py MODE`` as a target command.

It speaks the runner's frames (pytest_backendconf/target/_device.py) without
torch: ``hello`` with this machine's true versions (so that the host accepts
it), ``ready``, ``pong``, a worker's ``ready`` record for every ``open`` and
``ended`` for every ``close`` or ``kill``. What it answers to a worker's
message, or sends unasked, is the MODE's:

- ``verdict``: a replay answered with the old protocol's forged verdict
  ("bundle forward[0] passed"), whatever the archive holds;
- ``expected``: each bundle of a replayed archive answered with the
  archive's own expected outputs (what an honest device computes), then
  ``drop=N`` leaves bundle N out and ``extra=N`` adds an answer for a
  bundle N that the archive does not hold (``twice=N`` answers it twice);
- ``endless``: after ``hello``, one frame line that never ends;
- ``frame=LINE``: the first ``open`` answered with LINE as a frame (the
  first worker is number 1), then the device exits;
- ``hello=JSON``: ``hello`` with these fields changed (JSON object).

The link appends ``-m pytest_backendconf.target``, which is ignored.
"""

from __future__ import annotations

import base64
import json
import os
import sys


def send(frame: object) -> None:
    sys.stdout.buffer.write(json.dumps(frame).encode() + b"\n")
    sys.stdout.buffer.flush()


def expected_answers(archive: bytes, drop: int | None, extra: int | None, twice: int | None) -> list[dict]:
    """The archive's expected outputs as a device's answers, one record per bundle (no torch needed)."""
    from pytest_backendconf.archive import read_archive

    bundles = read_archive(archive).bundles
    assert bundles is not None
    tensors = [
        dict(meta, data=base64.b64encode(data).decode("ascii"))
        for meta, data in zip(
            ([{"dtype": m["dtype"], "shape": m["shape"]} for m in bundles.tensor_meta]), bundles.tensor_bytes
        )
    ]
    answers = []
    for method, records in bundles.records.items():
        for index, record in enumerate(records):
            if index == drop:
                continue
            answer = {
                "kind": "bundle",
                "method": method,
                "index": index,
                "outputs": {"value": record["expected"], "tensors": tensors},
            }
            answers += [answer] * (2 if index == twice else 1)
        if extra is not None:
            answers.append({"kind": "bundle", "method": method, "index": extra, "outputs": answers[-1]["outputs"]})
    return answers


def main(mode: str) -> int:
    from pytest_backendconf.target import versions

    name, _, value = mode.partition("=")
    hello = {"kind": "hello", "protocol": 1, "machine": "hostile", "pid": os.getpid(), **versions()}
    if name == "hello":
        hello.update(json.loads(value))
    send(hello)
    if name == "endless":
        chunk = b"x" * 65536
        while True:
            sys.stdout.buffer.write(chunk)
    send({"kind": "ready", "torch": hello["torch"]})
    options = dict(part.partition("=")[::2] for part in sys.argv[2:] if "=" in part)
    number = {k: int(v) for k, v in options.items() if k in ("drop", "extra", "twice")}
    blobs: dict[str, bytes] = {}
    stdin = sys.stdin.buffer
    for line in stdin:
        frame = json.loads(line)
        kind = frame.get("kind")
        if kind == "blob":
            blobs[frame["sha256"]] = stdin.read(frame["size"])
        elif kind == "ping":
            send({"kind": "pong", "id": frame.get("id")})
        elif kind == "open" and name == "frame":
            sys.stdout.buffer.write(value.encode() + b"\n")
            sys.stdout.buffer.flush()
            return 0  # the device goes away after its malformed frame: the host must notice at once
        elif kind == "open":
            send({"w": frame["w"], "r": {"kind": "ready", "pid": os.getpid()}})
        elif kind in ("close", "kill"):
            send({"kind": "ended", "w": frame["w"], "returncode": 0, "killed": kind == "kill"})
        elif kind == "to":
            w, message = frame["w"], frame["message"]
            if name == "verdict":
                forged = {"method": "forward", "index": 0, "outcome": "passed", "check": None}
                send({"w": w, "r": {"kind": "result", "error": None, "results": [forged]}})
            elif name == "expected":
                archive = blobs[message["archive"]["$blob"]]
                for answer in expected_answers(archive, number.get("drop"), number.get("extra"), number.get("twice")):
                    send({"w": w, "r": answer})
                send({"w": w, "r": {"kind": "result", "error": None}})
            else:
                send({"w": w, "r": {"kind": "result", "said": message.get("say")}})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
