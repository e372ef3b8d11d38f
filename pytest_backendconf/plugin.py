"""The pytest entry module (``pytest11``): the ``--backend`` option, backend selection, header.

Kept cheap to import: pytest loads it in every project where the package is
installed, so torch and the suite are imported only once ``--backend`` (or
the ``backendconf_backend`` ini option) selects a backend.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from .registry import BackendRegistry, RegisteredBackend, Source, set_active_registry, source_of_module
from .errors import RegistryError

if TYPE_CHECKING:  # the suite imports torch: only once a backend is selected
    from .suite import SuiteContext

# The report's schema version for --help, without importing the report package at every start;
# tests/test_suite_plugin.py checks that it is report._report.REPORT_SCHEMA_VERSION.
_REPORT_SCHEMA_VERSION = "1.9"

BACKEND_KEY = pytest.StashKey[RegisteredBackend]()
REGISTRY_KEY = pytest.StashKey[BackendRegistry]()
#: The name the suite plugin registers under; `-p no:backendconf_suite` turns the suite off.
SUITE_PLUGIN = "backendconf_suite"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("backendconf", "delegate-backend conformance (pytest-backendconf)")
    group.addoption(
        "--backend",
        dest="backendconf_backend",
        metavar="NAME",
        default=None,
        help="run the conformance suite against the backend registered as NAME "
        "(`backendconf list` shows them); overrides the backendconf_backend ini option",
    )
    group.addoption(
        "--backendconf-select",
        dest="backendconf_select",
        metavar="ID",
        action="append",
        help="run only the conformance checks whose id matches this fnmatch pattern "
        "(e.g. 'backendconf::parity::*[float16]'); repeatable",
    )
    group.addoption(
        "--backendconf-hypothesis",
        dest="backendconf_hypothesis",
        choices=("ci", "dev", "thorough"),
        default=None,
        help="Hypothesis profile of the parity checks: ci (6 examples, derandomized), dev (12), "
        "thorough (100); default ci when $CI is set, else dev",
    )
    group.addoption(
        "--backendconf-known-failures",
        dest="backendconf_known_failures",
        metavar="FILE",
        default=None,
        help="TOML file of known failures (test-id pattern = { reason = ..., link = ... }): listed checks "
        "are strict xfails, so a listed check that passes fails the run (docs/ci-gating.md)",
    )
    group.addoption(
        "--backendconf-write-known-failures",
        dest="backendconf_write_known_failures",
        metavar="FILE",
        default=None,
        help="after the run, write every failing conformance check to FILE as a known-failures file, "
        "keeping the reasons and links of entries that still fail",
    )
    group.addoption(
        "--backendconf-golden",
        dest="backendconf_golden",
        metavar="DIR",
        default=None,
        help="write, for every passing parity check, its archive bundled with the inputs it was checked on "
        "and eager's outputs into DIR (plus DIR/index.json), for `backendconf replay DIR` on a device",
    )
    group.addoption(
        "--backendconf-replay-on-target",
        dest="backendconf_replay_on_target",
        action="store_true",
        default=False,
        help="after the checks, replay the golden archives this run wrote (--backendconf-golden=DIR) on the "
        "device of --backendconf-target-command, in the same run: one check per bundle, category replay",
    )
    group.addoption(
        "--backendconf-report",
        dest="backendconf_report",
        metavar="FILE",
        default=None,
        help="write a JSON report of the conformance run to FILE "
        f"(schema backendconf-report {_REPORT_SCHEMA_VERSION}, see docs/ci-gating.md)",
    )
    group.addoption(
        "--backendconf-artifacts",
        dest="backendconf_artifacts",
        metavar="DIR",
        default=None,
        help="keep saved inputs and the files of rerun commands in DIR (created if missing), one folder "
        "per check that saved something, across runs; default: pytest's temporary folder, which keeps "
        "the last three runs (see also --basetemp)",
    )
    group.addoption(
        "--backendconf-html",
        dest="backendconf_html",
        metavar="FILE",
        default=None,
        help="write the conformance run as one self-contained HTML page to FILE: score cards, "
        "models x checks matrix, failures by root cause (docs/ci-gating.md)",
    )
    group.addoption(
        "--backendconf-zoo",
        dest="backendconf_zoo",
        choices=("synthetic", "real", "all"),
        default="synthetic",
        help="which models the per-model checks use: synthetic (the built-in zoo, default), real "
        "(resnet18, mobilenet_v3_small, ... a ViT and a text encoder; marker real_model; needs "
        "pip install 'pytest-backendconf[models]'), or all",
    )
    group.addoption(
        "--backendconf-timeout",
        dest="backendconf_timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds one conformance check may take before the process running it is killed and the "
        "check fails (default 120; 0: no limit); see docs/isolation.md",
    )
    group.addoption(
        "--backendconf-max-rss",
        dest="backendconf_max_rss",
        metavar="MIB",
        type=float,
        default=None,
        help="memory (resident, MiB) the process running the checks may reach; the check during which it "
        "grows past this fails and a fresh process runs the next ones (default 4096; 0: no limit)",
    )
    group.addoption(
        "--backendconf-minify",
        dest="backendconf_minify",
        choices=("on", "off"),
        default=None,
        help="on a model check's crash, hang, undeclared error or localised divergence, shrink the model's "
        "program to the smallest one that fails the same way and write it as a standalone script "
        "(default on; see docs/conformance-suite.md)",
    )
    group.addoption(
        "--backendconf-minify-budget",
        dest="backendconf_minify_budget",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds spent shrinking one failure (default 60); the summary says which ran out",
    )
    group.addoption(
        "--backendconf-minify-run-budget",
        dest="backendconf_minify_run_budget",
        metavar="SECONDS",
        default=None,
        help="seconds the whole run may spend on minimal reproductions, all pytest-xdist workers together "
        "(default 300; 0: no limit); once spent, a failure says its reproduction was skipped; also the "
        "backendconf_minify_run_budget ini option or $BACKENDCONF_MINIFY_RUN_BUDGET",
    )
    group.addoption(
        "--backendconf-in-process",
        dest="backendconf_in_process",
        action="store_true",
        default=False,
        help="run the conformance checks in the pytest process, not in the backend host process: for "
        "debuggers (--pdb does it too); a crashing, hanging or leaking backend then takes the run down",
    )
    group.addoption(
        "--backendconf-ops",
        dest="backendconf_ops",
        choices=("quick", "default", "all"),
        default="default",
        help="samples of the ops category: default (up to two samples per operator overload in each dtype "
        "under test, shipped as data), quick (one sample in float32 and float16: for engines whose lowering "
        "takes seconds) or all (every OpInfo sample; discovered once per torch version, which takes minutes)",
    )
    group.addoption(
        "--backendconf-batch",
        dest="backendconf_batch",
        choices=("auto", "on", "off"),
        default=None,
        help="lower several ops checks as one program, for engines that pay per lowering: auto (default: "
        "when the backend declares Capabilities(batch_ops=True)), on or off; every check keeps the outcome "
        "it has alone (docs/conformance-suite.md, 'Batched operator checks')",
    )
    group.addoption(
        "--backendconf-target-command",
        dest="backendconf_target_command",
        metavar="CMD",
        default=None,
        help="a command prefix that starts a Python on a device (e.g. 'ssh ci@board /opt/venv/bin/python'); "
        "the target-stage checks run there through `CMD -m pytest_backendconf.target` (docs/vendor-ci.md); "
        "also the backendconf_target_command ini option or $BACKENDCONF_TARGET_COMMAND",
    )
    group.addoption(
        "--backendconf-shard",
        dest="backendconf_shard",
        metavar="K/N",
        default=None,
        help="run only the K-th of N shards of the conformance checks (1-based), one per CI job: the same "
        "collection gives the same shards on every machine, a model's checks stay in one shard; join the shards' "
        "reports with `backendconf report merge --output` (docs/vendor-ci.md); also the backendconf_shard ini "
        "option or $BACKENDCONF_SHARD",
    )
    group.addoption(
        "--backendconf-durations",
        dest="backendconf_durations",
        metavar="REPORT",
        default=None,
        help="balance the shards of --backendconf-shard by the checks' durations in an earlier run's "
        "--backendconf-report file (a check it does not list counts the median) instead of by check counts; "
        "also the backendconf_durations ini option or $BACKENDCONF_DURATIONS",
    )
    group.addoption(
        "--backendconf-cache",
        dest="backendconf_cache",
        metavar="DIR",
        default=None,
        help="keep preprocess() results in DIR (created if missing) and reuse them in later runs: a lowering "
        "whose program, compile spec, debug handles, backend files and torch build are unchanged skips "
        "preprocess (compile and execute always run); off unless given (docs/conformance-suite.md, 'Reusing "
        "lowerings across runs'); also the backendconf_cache ini option or $BACKENDCONF_CACHE",
    )
    group.addoption(
        "--backendconf-cache-size",
        dest="backendconf_cache_size",
        metavar="MIB",
        default=None,
        help="the size cap of --backendconf-cache's folder in MiB (default 1024); the least recently used "
        "entries go first; also the backendconf_cache_size ini option",
    )
    group.addoption(
        "--backendconf-cache-verify",
        dest="backendconf_cache_verify",
        metavar="SHARE",
        default=None,
        help="run preprocess() again for a share of --backendconf-cache's hits (a fraction such as 0.1, or "
        "'all'; default none) and fail the lowering whose blob differs from its entry's (a tampered or stale "
        "entry); also the backendconf_cache_verify ini option or $BACKENDCONF_CACHE_VERIFY",
    )
    parser.addini(
        "backendconf_cache",
        "folder that keeps preprocess results across runs (--backendconf-cache)",
        default="",
    )
    parser.addini(
        "backendconf_cache_size",
        "size cap of the preprocess cache's folder in MiB (--backendconf-cache-size)",
        default="",
    )
    parser.addini(
        "backendconf_cache_verify",
        "share of the preprocess cache's hits run again to compare (--backendconf-cache-verify)",
        default="",
    )
    parser.addini(
        "backendconf_shard",
        "K/N: run only the K-th of N shards of the conformance checks (--backendconf-shard)",
        default="",
    )
    parser.addini(
        "backendconf_durations",
        "an earlier --backendconf-report file whose durations balance the shards (--backendconf-durations)",
        default="",
    )
    parser.addini(
        "backendconf_minify_run_budget",
        "seconds the run may spend on minimal reproductions (--backendconf-minify-run-budget; default 300, 0: no limit)",
        default="",
    )
    parser.addini(
        "backendconf_target_command",
        "command prefix that starts a Python on a device for the target-stage checks (--backendconf-target-command)",
        default="",
    )
    parser.addini(
        "backendconf_batch",
        "auto, on or off: whether the ops category lowers several checks as one program (--backendconf-batch)",
        default="auto",
    )
    parser.addini(
        "backendconf_backend",
        "backend the conformance suite checks when --backend is not given",
        default="",
    )


def selected_name(config: pytest.Config) -> str | None:
    """The backend named by ``--backend`` or the ini option, if any."""
    return config.getoption("backendconf_backend") or config.getini("backendconf_backend") or None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    name = selected_name(config)
    if name is None:
        return
    try:
        import torch  # noqa: F401  (only now: a backend was selected)
    except ImportError as exc:
        raise pytest.UsageError(
            f"--backend={name} needs PyTorch, which cannot be imported here ({exc}). "
            "Install the torch build you target first, e.g. `pip install torch==2.13.0` "
            "(see pytest-backendconf's docs/installing.md)."
        ) from None
    registry = registry_for(config, select=name)
    try:
        selected = registry.get(name)
    except RegistryError as exc:
        raise pytest.UsageError(str(exc)) from None
    zoo = config.getoption("backendconf_zoo", "synthetic")
    if zoo != "synthetic":
        from .conformance.real_models import torchvision_available

        if not torchvision_available():
            raise pytest.UsageError(
                f"--backendconf-zoo={zoo} needs torchvision for its vision models, which is not installed: "
                "pip install 'pytest-backendconf[models]' (it pins the torchvision built for your torch), "
                "or run with --backendconf-zoo=synthetic."
            )
    config.stash[REGISTRY_KEY] = registry
    config.stash[BACKEND_KEY] = selected
    _connect_target(config)
    from .suite import GOLDEN_KEY, golden_dir

    config.stash[GOLDEN_KEY] = golden_dir(config, config.getoption("backendconf_golden", None))
    from .suite import CACHE_KEY, cache_choice

    config.stash[CACHE_KEY] = cache_choice(config)
    if config.getoption("backendconf_replay_on_target", False):
        missing = [
            what
            for what, given in (
                ("--backendconf-golden=DIR (the archives to replay)", config.stash[GOLDEN_KEY] is not None),
                ("--backendconf-target-command=CMD (the device)", TARGET_KEY in config.stash),
            )
            if not given
        ]
        if missing:
            raise pytest.UsageError(f"--backendconf-replay-on-target needs {' and '.join(missing)}: add it")
    set_active_registry(registry)
    if not config.pluginmanager.is_blocked(SUITE_PLUGIN):
        from .suite import SuitePlugin, suite_only

        if suite_only(config):
            config.args = []  # the suite alone, not whatever is in the current folder
        config.pluginmanager.register(
            SuitePlugin(config, lambda: _make_context(config, registry, selected), selected.name), SUITE_PLUGIN
        )
        if config.pluginmanager.hasplugin("xdist") and not config.pluginmanager.is_blocked("backendconf_xdist"):
            from .suite import ModelGrouping

            config.pluginmanager.register(ModelGrouping(), "backendconf_xdist")  # one worker per model
        _register_shard(config)
        if not config.pluginmanager.is_blocked("backendconf_gating"):
            from .suite import GatingPlugin

            config.pluginmanager.register(
                GatingPlugin(config, selected, config.stash.get(TARGET_KEY, None)), "backendconf_gating"
            )


def _register_shard(config: pytest.Config) -> None:
    """Keep one shard of the checks when ``--backendconf-shard`` (or its ini option, or variable) asks."""
    from .suite import ShardPlugin, shard_choice

    shard = shard_choice(config)
    if shard is None:
        if config.getoption("backendconf_durations", None):
            raise pytest.UsageError(
                "--backendconf-durations balances the shards of --backendconf-shard=K/N, which is not given: "
                "add --backendconf-shard or leave --backendconf-durations out"
            )
        return
    config.pluginmanager.register(ShardPlugin(config, *shard), "backendconf_shard")


#: The device's `target.probe` record when a target command is set (header, summary, report).
TARGET_KEY = pytest.StashKey[dict]()


def target_command_of(config: pytest.Config) -> str | None:
    """``--backendconf-target-command``, else the ini option, else ``$BACKENDCONF_TARGET_COMMAND``."""
    from .target import TARGET_COMMAND_ENV as COMMAND_ENV

    return (
        config.getoption("backendconf_target_command", None)
        or config.getini("backendconf_target_command")
        or os.environ.get(COMMAND_ENV)
        or None
    )


def _connect_target(config: pytest.Config) -> None:
    """Reach the device once at start: one usage error if it cannot be reached, else its versions for the header."""
    command = target_command_of(config)
    if command is None:
        return
    from .errors import TargetUnreachable, TargetVersionError
    from .target import probe, use_target_command

    try:
        config.stash[TARGET_KEY] = probe(command)
    except (TargetUnreachable, TargetVersionError) as exc:
        raise pytest.UsageError(f"--backendconf-target-command: {exc}") from None
    use_target_command(command)


def target_lines(info: dict) -> list[str]:
    """The device in the header: where it is, what it runs, and the command that reaches it (secrets masked)."""
    backends = ", ".join(f"{name} {entry.get('version')}" for name, entry in sorted(info["backends"].items()))
    return [
        f"backendconf: target device {info['machine']} (Python {info['python']}, torch {info['torch']}, "
        f"pytest-backendconf {info['pytest_backendconf']}; backends: {backends or 'none'})",
        f"backendconf: target command {info['command']}",
    ]


def _make_context(config: pytest.Config, registry: BackendRegistry, selected: RegisteredBackend) -> SuiteContext:
    import tempfile
    from pathlib import Path

    from .suite import build_context, suite_options

    factory = getattr(config, "_tmp_path_factory", None)

    def tmp_dir(name: str) -> Path:
        if factory is not None:
            return factory.mktemp(name)
        return Path(tempfile.mkdtemp(prefix=f"backendconf-{name}-"))

    return build_context(suite_options(config, selected.name), registry, tmp_dir)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    info = config.stash.get(TARGET_KEY, None)
    if info is None:
        return
    rtt = info.get("round_trip_ms")
    terminalreporter.write_line(
        f"backendconf: target link: connected in {info['connect_seconds']:.2f} s; each request to the device costs "
        f"{'?' if rtt is None else f'{rtt:.1f}'} ms of link round trip (median of 5), plus its archive's bytes once "
        "per connection"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if REGISTRY_KEY in config.stash:
        set_active_registry(None)
    if TARGET_KEY in config.stash:
        from .target import use_target_command

        use_target_command(None)


def registry_for(config: pytest.Config, select: str | None) -> BackendRegistry:
    """A registry fed by pytest's plugins (``-p`` modules, conftests) and entry points."""
    registry = BackendRegistry()
    manager = config.pluginmanager
    for plugin in manager.get_plugins():
        registry.add_plugin(plugin, _describe_pytest_plugin(plugin, manager.get_name(plugin)))
    try:
        registry.load_entry_points(select=select)
    except RegistryError as exc:
        raise pytest.UsageError(str(exc)) from None
    return registry


def _describe_pytest_plugin(plugin: object, name: str | None) -> Source:
    path = getattr(plugin, "__file__", None)
    if path and os.path.basename(path) == "conftest.py":
        return Source(f"conftest {path}")
    return source_of_module(plugin, f"pytest plugin {name}" if name else f"pytest plugin {plugin!r}")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    selected = config.stash.get(BACKEND_KEY, None)
    if selected is None:
        return None
    available, reason = selected.availability()
    state = "available" if available else f"not available: {reason}"
    from .backend import TorchScriptBackend

    kind = f" [{selected.backend.describe()}]" if isinstance(selected.backend, TorchScriptBackend) else ""
    lines = [f"backendconf: backend {selected.name!r} from {selected.source}{kind}, {state}"]
    if TARGET_KEY in config.stash:
        lines += target_lines(config.stash[TARGET_KEY])
    if config.pluginmanager.has_plugin(SUITE_PLUGIN):
        from .suite import hypothesis_choice

        profile, seed = hypothesis_choice(config)
        lines.append(
            f"backendconf: hypothesis profile {profile!r}, seed {seed} (reproduce with --hypothesis-seed={seed})"
        )
        import torch

        # Set in the suite's pytest_configure; every process it starts (host, target) takes the same.
        lines.append(f"backendconf: torch intra-op threads {torch.get_num_threads()} (in every process of the run)")
    return lines
