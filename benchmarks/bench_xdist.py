"""Serial against pytest-xdist: wall time, CPU time and exports of the default suite, side by side.

    python benchmarks/bench_xdist.py                    # serial, -n 2, -n 2 without the model grouping
    python benchmarks/bench_xdist.py --rounds 2 --backend reference -- --backendconf-select='parity::*'

Each configuration runs the suite in a fresh empty folder, in a subprocess,
``--rounds`` times in rotation (so that a burst of load from other jobs hits
each alike) and keeps the fastest. The export counts come from
``bench_suite_stats`` (every ``torch.export.export`` call of every process):
with xdist's plain ``--dist load`` both workers export most models, with the
grouping by model each model once. Prints a table; ``--json FILE`` saves it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent

CONFIGURATIONS = {
    "serial": [],
    "-n 2 (grouped by model)": ["-n", "2"],
    "-n 2, plain --dist load": ["-n", "2", "-p", "no:backendconf_xdist"],
}


def run_once(backend: str, extra: list[str], args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-xdist-") as folder:
        stats = Path(folder, "stats")
        stats.mkdir()
        env = {
            **os.environ,
            "BACKENDCONF_BENCH_STATS": str(stats),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        env.setdefault("OMP_NUM_THREADS", "1")
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"--backend={backend}",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "bench_suite_stats",
            *extra,
            *args,
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1):
            raise SystemExit(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        files = [json.loads(p.read_text()) for p in stats.glob("*.json")]
        return {
            "wall": wall,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "exports": sum(f.get("exports", 0) for f in files),
            "unique": max((f.get("unique_exports", 0) for f in files), default=0),
            "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "",
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--rounds", type=int, default=1, help="runs per configuration; the fastest is kept")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for every run")
    args = parser.parse_args()
    best: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for name, extra in CONFIGURATIONS.items():
            print(f"round {round_ + 1}: {name} …", file=sys.stderr, flush=True)
            result = run_once(args.backend, extra, args.pytest_args)
            if name not in best or result["wall"] < best[name]["wall"]:
                best[name] = result
    serial = best["serial"]["wall"]
    print(f"{'configuration':<26} {'wall s':>8} {'÷ serial':>9} {'CPU s':>8} {'exports':>8}  outcome")
    for name, result in best.items():
        print(
            f"{name:<26} {result['wall']:>8.1f} {result['wall'] / serial:>9.2f} {result['cpu']:>8.1f} "
            f"{result['exports']:>8}  {result['summary']}"
        )
    print(f"(load average now: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(best, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
