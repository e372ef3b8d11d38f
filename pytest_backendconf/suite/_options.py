"""`SuiteOptions`: the run's settings that matter to checks, as one record both processes build from.

`suite_options` reads them once in the pytest process, from its options, ini values and environment
(each through the choice that checks it: `hypothesis_choice`, `artifacts_root`, `cache_choice`, the
target command the plugin connected). The session's `SuiteContext` keeps the record; the backend host
receives it over its protocol as JSON (`options_to_json`, `options_from_json`), and
`_context.build_context` turns it into a context in either process, so that both generate the same
checks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import pytest

from ._preprocess_cache import CACHE_KEY, CacheChoice


@dataclasses.dataclass(frozen=True)
class SuiteOptions:
    """What a run asks of its checks; the defaults are a run with no options given.

    :param backend: the registered name of the backend under test (``--backend``).
    :param hypothesis_profile: ``--backendconf-hypothesis``, or the default for this machine.
    :param hypothesis_seed: the session's seed (``--hypothesis-seed``, else a fresh one).
    :param zoo: ``--backendconf-zoo``: which models the per-model checks use.
    :param ops_mode: ``--backendconf-ops``: which operator samples the ops category runs.
    :param plugin_modules: the run's ``-p`` modules, for the rerun commands the checks print.
    :param artifacts_root: ``--backendconf-artifacts``, absolute (None: temporary folders).
    :param golden_dir: ``--backendconf-golden``: where passing parity checks write their bundled archives.
    :param target_command: the device's command (``--backendconf-target-command``), once reached.
    :param cache: ``--backendconf-cache``: the preprocess cache's folder and size cap (None: no cache).
    :param tmp_root: where the backend host makes its temporary folders (None: the system's).
    """

    backend: str
    hypothesis_profile: str = "ci"
    hypothesis_seed: int = 0
    zoo: str = "synthetic"
    ops_mode: str = "default"
    plugin_modules: tuple[str, ...] = ()
    artifacts_root: str | None = None
    golden_dir: str | None = None
    target_command: str | None = None
    cache: CacheChoice | None = None
    tmp_root: str | None = None

    def __post_init__(self) -> None:
        if not self.backend:
            raise ValueError("suite options name the backend under test; got an empty name")
        if not isinstance(self.plugin_modules, tuple):  # a list would make the record unhashable and mutable
            object.__setattr__(self, "plugin_modules", tuple(self.plugin_modules))


def suite_options(config: pytest.Config, backend: str) -> SuiteOptions:
    """The record of this pytest run, for the backend registered as ``backend``.

    :raises pytest.UsageError: ``--backendconf-artifacts`` names something that cannot be a folder.
    """
    from ..target import target_command
    from ._golden import GOLDEN_KEY
    from ._hypothesis import hypothesis_choice

    profile, seed = hypothesis_choice(config)
    golden = config.stash.get(GOLDEN_KEY, None)
    return SuiteOptions(
        backend=backend,
        hypothesis_profile=profile,
        hypothesis_seed=seed,
        zoo=config.getoption("backendconf_zoo", "synthetic"),
        ops_mode=config.getoption("backendconf_ops", "default"),
        plugin_modules=tuple(p for p in config.known_args_namespace.plugins or [] if not p.startswith("no:")),
        artifacts_root=artifacts_root(config),
        golden_dir=None if golden is None else str(golden),
        # What the plugin connected to at start (`use_target_command`): the same device for every process.
        target_command=target_command(),
        cache=config.stash.get(CACHE_KEY, None),
    )


def artifacts_root(config: pytest.Config) -> str | None:
    """``--backendconf-artifacts``, made absolute and created; a usage error when it cannot be a folder."""
    value = config.getoption("backendconf_artifacts", None)
    if not value:
        return None
    path = Path(config.invocation_params.dir, value)
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(
            f"--backendconf-artifacts={value}: {path} is a file; give a folder (created if missing)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(
            f"--backendconf-artifacts={value}: cannot create {path}: {exc.strerror or exc}"
        ) from None
    return str(path.resolve())


def options_to_json(options: SuiteOptions) -> dict[str, Any]:
    """The record as JSON data, for the backend host's setup message."""
    return dataclasses.asdict(options)


def options_from_json(data: Mapping[str, Any]) -> SuiteOptions:
    """The record `options_to_json` wrote; an unknown or missing field is a `ValueError` naming it."""
    names = {field.name for field in dataclasses.fields(SuiteOptions)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"suite options have no field(s) {', '.join(map(repr, unknown))}")
    if "backend" not in data:
        raise ValueError('suite options need their "backend"')
    values = dict(data)
    if values.get("cache") is not None:
        values["cache"] = CacheChoice(**values["cache"])
    values["plugin_modules"] = tuple(values.get("plugin_modules") or ())
    return SuiteOptions(**values)
