"""The ops category batched and unbatched, per engine, in one run: wall time, ratio, and every outcome compared.

    python benchmarks/bench_batching.py                           # every installed engine, default ops
    python benchmarks/bench_batching.py --engine onnxruntime --ops quick --rounds 2

For each engine (a backend declaring ``Capabilities(batch_ops=True)``; those
not installed are skipped), the ops category runs twice in fresh folders, in
subprocesses, with ``--backendconf-batch=on`` and ``=off`` (in rotation over
``--rounds``, keeping the fastest of each, so that a burst of load from other
jobs hits both alike). The two JSON reports are then compared check by check:
outcome, error type and message (temporary paths masked), numerics. A
difference is printed and makes the exit status 1. The wall time includes
the pytest process's and the backend host's start (a few seconds, the same
in both); the CPU time (of pytest and its backend host) is the figure to
compare on a loaded machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Engines and the module that must import for each (the real engines by default; ``reference`` on request).
ENGINES = {
    "onnxruntime": "backendconf_onnxruntime",
    "executorch": "backendconf_executorch",
    "openvino": "backendconf_openvino",
    "reference": "backendconf_reference",
}
REAL_ENGINES = ("onnxruntime", "executorch", "openvino")


def run_once(engine: str, batch: str, ops: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as folder:
        report = Path(folder, "report.json")
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"--backend={engine}",
            "-m",
            "ops",
            f"--backendconf-ops={ops}",
            f"--backendconf-batch={batch}",
            "--backendconf-hypothesis=ci",
            f"--backendconf-report={report}",
            "-q",
            "-p",
            "no:cacheprovider",
            *extra,
        ]
        env = {**os.environ, "BACKENDCONF_MINIFY": "off"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1) or not report.exists():
            raise SystemExit(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        tests = {t["id"]: t for t in json.loads(report.read_text())["tests"]}
        shared = re.search(r"batched: (\d+) checks decided in (\d+) shared lowerings", done.stdout)
        # A backend whose list of rejected nodes its runs alone contradicted (the summary says so).
        wrong = re.search(r"the backend named (\d+) nodes? as rejected in a batch", done.stdout)
        return {
            "wall": wall,
            # CPU of pytest and its backend host: on a loaded machine the figure to compare.
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "tests": tests,
            "shared": [int(shared[1]), int(shared[2])] if shared else None,
            "contradicted": int(wrong[1]) if wrong else 0,
            "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "",
        }


def comparable(record: dict) -> str:
    """A check's record without its duration and with temporary paths and set-ordered texts masked."""
    text = json.dumps({k: v for k, v in record.items() if k != "duration"}, sort_keys=True)
    text = re.sub(r"/tmp/\S*?/(pytest-\d+|ops-inputs[^/]*)/", "/TMP/", re.sub(r"pytest-\d+", "pytest-N", text))
    # torch.onnx prints a type constraint's members in set order, which differs from process to process.
    return re.sub(r"[A-Z][A-Z0-9]*(?: \| [A-Z][A-Z0-9]*)+", lambda m: " | ".join(sorted(m[0].split(" | "))), text)


def differences(batched: dict, alone: dict) -> list[str]:
    found = [f"only batched: {i}" for i in batched.keys() - alone.keys()]
    found += [f"only unbatched: {i}" for i in alone.keys() - batched.keys()]
    for check_id in sorted(batched.keys() & alone.keys()):
        if comparable(batched[check_id]) != comparable(alone[check_id]):
            a, b = batched[check_id], alone[check_id]
            found.append(f"{check_id}: batched {a['outcome']} / unbatched {b['outcome']}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", choices=sorted(ENGINES), help="default: every installed one")
    parser.add_argument("--ops", default="default", choices=("quick", "default", "all"))
    parser.add_argument("--rounds", type=int, default=1, help="runs per configuration; the fastest is kept")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for every run")
    args = parser.parse_args(argv)
    engines = [e for e in args.engine or REAL_ENGINES if importlib.util.find_spec(ENGINES[e]) is not None]
    rows: dict[str, dict] = {}
    status = 0
    for engine in engines:
        best: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for batch in ("on", "off"):
                print(f"{engine}: round {round_ + 1}, batching {batch} …", file=sys.stderr, flush=True)
                result = run_once(engine, batch, args.ops, args.pytest_args)
                if batch not in best or result["wall"] < best[batch]["wall"]:
                    best[batch] = result
        found = differences(best["on"]["tests"], best["off"]["tests"])
        if best["on"]["contradicted"]:
            found.append(f"the backend's rejection lists named {best['on']['contradicted']} nodes it compiles alone")
        status |= bool(found)
        rows[engine] = {
            "checks": len(best["off"]["tests"]),
            "batched_s": best["on"]["wall"],
            "unbatched_s": best["off"]["wall"],
            "ratio": best["off"]["wall"] / best["on"]["wall"],
            "batched_cpu_s": best["on"]["cpu"],
            "unbatched_cpu_s": best["off"]["cpu"],
            "cpu_ratio": best["off"]["cpu"] / best["on"]["cpu"],
            "shared": best["on"]["shared"],
            "differences": found,
            "summary": {k: best[k]["summary"] for k in best},
        }
    print(
        f"{'engine':<12} {'checks':>7} {'unbatched s':>12} {'batched s':>10} {'ratio':>6} "
        f"{'CPU ratio':>9}  shared  differences"
    )
    for engine, row in rows.items():
        shared = f"{row['shared'][0]} in {row['shared'][1]}" if row["shared"] else "-"
        print(
            f"{engine:<12} {row['checks']:>7} {row['unbatched_s']:>12.1f} {row['batched_s']:>10.1f} "
            f"{row['ratio']:>5.2f}x {row['cpu_ratio']:>8.2f}x  {shared}  {len(row['differences'])}"
        )
        for line in row["differences"][:20]:
            print(f"    {line}")
    print(f"(load average now: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
