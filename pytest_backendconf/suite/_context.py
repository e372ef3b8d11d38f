"""`SuiteContext`: what every check of one session shares, built lazily and cached.

Exports are the slow step, so each (model, dtype, method) is exported once
per session and lowered as often as the checks need; lowerings with the
same compile spec are shared too. Checks must treat what they get from here
as read-only.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar, cast

import torch

from .. import _compat
from ..debuginfo import walk_nodes
from ..lowering import WrapperModule
from ..lowering import export_method, lower_programs
from ..lowering import normalize as normalize_call
from ..registry import BackendRegistry, RegisteredBackend
from ..backend import Backend
from ..capabilities import Capabilities, capabilities_of
from ..cases import FLOAT_DTYPES, ModelCase, TensorInput
from ._options import SuiteOptions

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from ._host import BackendHost

#: The dtype id of a case whose inputs do not follow the float dtype under test.
FIXED = "fixed"

_T = TypeVar("_T")


class SuiteContext:
    """The selected backend, the model cases, the run's options, and the session's caches.

    It satisfies `checks.CheckContext`: what the check machinery reads of it.
    """

    def __init__(
        self,
        registered: RegisteredBackend,
        cases: list[ModelCase],
        *,
        tmp_dir: Callable[[str], Path],
        options: SuiteOptions | None = None,
    ) -> None:
        self.registered = registered
        self.backend: Backend = registered.backend
        self.name: str = registered.name
        self.capabilities: Capabilities = capabilities_of(self.backend)
        self.cases = {case.name: case for case in cases}
        #: The run's settings the checks follow (`build_context` makes the context from them).
        self.options = options if options is not None else SuiteOptions(backend=registered.name)
        self._tmp_dir = tmp_dir
        self._lock = threading.RLock()
        self._modules: dict[tuple[str, str], torch.nn.Module] = {}
        self._programs: dict[tuple[str, ...], ExportedProgram] = {}
        self._fingerprints: dict[tuple[str, ...], tuple[list[tuple], dict[str, torch.Tensor]]] = {}
        self._lowered: dict[tuple[str, ...], WrapperModule] = {}
        self._memo: dict[tuple, object] = {}
        #: How many exports ran: the benchmark compares it with the unique keys.
        self.export_count = 0
        #: Where the ops category's sample discovery reports progress (the terminal; None: nowhere).
        self.discovery_progress: Callable[[str], None] | None = None
        #: The session's backend host process, once started: the benchmarks read its export counts.
        self.host: BackendHost | None = None

    # --- the run's options ------------------------------------------------------------

    @property
    def hypothesis_profile(self) -> str:
        """``--backendconf-hypothesis``: the profile of the checks that draw inputs."""
        return self.options.hypothesis_profile

    @property
    def hypothesis_seed(self) -> int:
        """The session's seed (``--hypothesis-seed``)."""
        return self.options.hypothesis_seed

    @property
    def ops_mode(self) -> str:
        """``--backendconf-ops``: which operator samples the ops category runs."""
        return self.options.ops_mode

    @property
    def plugin_modules(self) -> tuple[str, ...]:
        """The ``-p`` plugins of the run, for commands that rerun one comparison outside pytest."""
        return self.options.plugin_modules

    @property
    def artifacts_root(self) -> str | None:
        """``--backendconf-artifacts``: where `artifact_dir` makes its folders (None: temporary ones)."""
        return self.options.artifacts_root

    @property
    def golden_dir(self) -> str | None:
        """``--backendconf-golden``: the folder passing parity checks write their bundled archives to."""
        return self.options.golden_dir

    # --- dtypes ---------------------------------------------------------------

    def dtypes_for(self, case: ModelCase) -> list[str]:
        """The dtype ids a case runs in: its float dtypes the backend declares, or `FIXED`."""
        if not case.uses_float:
            return [FIXED]
        declared = self.capabilities.dtypes
        return [d for d in case.float_dtypes if declared is None or getattr(torch, d) in declared]

    def first_dtype(self, case_name: str) -> str | None:
        """The dtype a per-model check uses: the case's first runnable one (``None``: unknown
        case, or none of its dtypes is declared by the backend)."""
        case = self.cases.get(case_name)
        dtypes = self.dtypes_for(case) if case is not None else []
        return dtypes[0] if dtypes else None

    # --- models, inputs, programs, lowerings ----------------------------------------

    def module(self, case_name: str, dtype: str) -> torch.nn.Module:
        """The eager model in ``dtype`` (weights cast too), built once."""
        key = (case_name, dtype)
        with self._lock:
            if key not in self._modules:
                module = self.cases[case_name].build()
                if dtype in FLOAT_DTYPES:
                    module = module.to(getattr(torch, dtype))
                self._modules[key] = module.eval()
            return self._modules[key]

    def example(
        self, case_name: str, dtype: str, method: str, seed: int = 0, mode: str = "random", sizes: dict | None = None
    ) -> tuple[tuple, dict]:
        """Deterministic example ``(args, kwargs)`` for one method (the export uses seed 0).

        ``sizes`` gives some `Dim`s of a dynamic case other sizes than the example's.
        """
        case = self.cases[case_name]
        generator = torch.Generator().manual_seed(seed)
        sizes = {**case.example_sizes(), **(sizes or {})} if case.dims else None
        args = tuple(make_input(spec, dtype, generator, mode, sizes) for spec in case.inputs[method])
        return args, dict(case.kwargs.get(method, {}))

    def flat_inputs(self, case_name: str, dtype: str, method: str, seed: int = 0) -> list:
        """What ``execute`` receives for an example: the flat user inputs, defaults bound as at export."""
        args, kwargs = self.example(case_name, dtype, method, seed=seed)
        module_type = type(self.module(case_name, dtype))
        args, kwargs = normalize_call(getattr(module_type, method), method, args, kwargs)
        return _compat.tree_leaves((args, kwargs))

    def program(self, case_name: str, dtype: str, method: str, *, dynamic: bool = False) -> ExportedProgram:
        """The exported program of one method, exported once per session.

        ``dynamic``: exported with the case's `Dim`s as ``dynamic_shapes`` (a
        separate program: the static one stays what every other check uses).
        """
        key = (case_name, dtype, method, "dynamic") if dynamic else (case_name, dtype, method)
        with self._lock:
            if key not in self._programs:
                args, kwargs = self.example(case_name, dtype, method)
                shapes = self.cases[case_name].dynamic_shapes(method) if dynamic else None
                program = export_method(self.module(case_name, dtype), method, args, kwargs, dynamic_shapes=shapes)
                self._programs[key] = program
                self._fingerprints[key] = _fingerprint(program)
                self.export_count += 1
            return self._programs[key]

    def program_changes(self, case_name: str, dtype: str, method: str) -> list[str]:
        """What changed in a cached program since its export (the graph, parameter names)."""
        program = self.program(case_name, dtype, method)
        code, state = self._fingerprints[(case_name, dtype, method)]
        changes = ["the graph"] if _graph_structure(program) != code else []
        current = dict(program.state_dict)
        changes += [
            f"parameter {name!r}"
            for name, value in state.items()
            if name not in current or not torch.equal(current[name], value)
        ]
        return changes

    def has_lowered(self, case_name: str, dtype: str, spec: dict | None = None, *, dynamic: bool = False) -> bool:
        """Whether `lower` would return a cached lowering (so reusing it costs nothing)."""
        spec = spec if spec is not None else {m: {} for m in self.cases[case_name].methods}
        key = (case_name, dtype, json.dumps(spec, sort_keys=True)) + (("dynamic",) if dynamic else ())
        with self._lock:
            return key in self._lowered

    def lower(
        self,
        case_name: str,
        dtype: str,
        spec: dict | None = None,
        *,
        backend: Backend | None = None,
        cache: bool = True,
        dynamic: bool = False,
    ) -> WrapperModule:
        """The case lowered to the backend (or ``backend``): shared per compile spec unless ``cache=False``.

        ``dynamic``: the programs exported with dynamic shapes (see `program`).
        """
        case = self.cases[case_name]
        spec = spec if spec is not None else {m: {} for m in case.methods}
        key = (case_name, dtype, json.dumps(spec, sort_keys=True)) + (("dynamic",) if dynamic else ())
        use_cache = cache and backend is None
        with self._lock:
            if use_cache and key in self._lowered:
                return self._lowered[key]
            programs = {m: self.program(case_name, dtype, m, dynamic=dynamic) for m in spec}
        lowered = lower_programs(
            programs,
            backend or self.backend,
            spec,
            module_type=type(self.module(case_name, dtype)),
            backend_version=self.registered.source.version,
        )
        if use_cache:
            with self._lock:
                self._lowered.setdefault(key, lowered)
        return lowered

    def program_keys(self) -> list[tuple[str, ...]]:
        """The keys of the programs exported so far (``(case, dtype, method)``, ``"dynamic"`` appended)."""
        with self._lock:
            return list(self._programs)

    def memo(self, key: tuple, make: Callable[[], _T]) -> _T:
        """``make()`` once per session for ``key``; for work several checks share.

        A key names one kind of work: what is stored under it is what a ``make`` of that key returned.
        """
        with self._lock:
            if key in self._memo:
                return cast(_T, self._memo[key])
        value = make()
        with self._lock:
            return cast(_T, self._memo.setdefault(key, value))

    def tmp_dir(self, name: str) -> Path:
        """A fresh temporary directory for one check."""
        return self._tmp_dir(name)

    def artifact_dir(self, name: str) -> Path:
        """A fresh directory for files a printed command names (saved inputs, rerun files).

        Under ``--backendconf-artifacts`` (`artifacts_root`), kept across runs;
        else a temporary directory like `tmp_dir`'s.
        """
        if not self.artifacts_root:
            return self._tmp_dir(name)
        import tempfile

        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.artifacts_root))

    def rerun_command(self, path: str | os.PathLike[str]) -> str:
        """The shell command that reruns one saved comparison: ``python -m pytest_backendconf.rerun FILE``.

        Every part is quoted for the shell (`_quoting.shell_command`): the
        backend's name and the file's path come from outside this package.
        """
        from .._quoting import shell_command

        plugins = [part for module in self.plugin_modules for part in ("-p", module)]
        return shell_command(
            ["python", "-m", "pytest_backendconf.rerun", str(path), f"--backend={self.name}", *plugins]
        )


def build_context(options: SuiteOptions, registry: BackendRegistry, tmp_dir: Callable[[str], Path]) -> SuiteContext:
    """The session's context as ``options`` ask: the zoo and the registry's cases, the backend they name.

    The one place a `SuiteContext` is made from a run's options: the pytest process (`plugin`), the
    backend host (`_host`) and ``python -m pytest_backendconf.rerun`` all build it here, so that the
    pytest process and the host generate the same checks. It also points this process at what the
    options name outside the context: lowerings here use the options' preprocess cache, and
    target-stage children run on the options' device.

    :param tmp_dir: makes a fresh temporary folder per name (pytest's own in the pytest process).
    :raises RegistryError: the registry has no backend of that name.
    """
    from ..backend import TorchScriptBackend
    from ..conformance import load_torchscript_zoo, load_zoo
    from ..target import use_target_command
    from ._preprocess_cache import install_cache

    selected = registry.get(options.backend)
    # The seeds' own models (add and sub) are TorchScript's: the export form has its own zoo for those ops.
    seeds = load_torchscript_zoo() if isinstance(selected.backend, TorchScriptBackend) else []
    real = []
    if options.zoo != "synthetic":
        from ..conformance.real_models import real_cases

        real = real_cases()
    # The synthetic zoo stays in the context under `real`: checks name some of its models.
    ctx = SuiteContext(selected, load_zoo() + seeds + real + registry.cases(), tmp_dir=tmp_dir, options=options)
    # preprocess runs in this process (the host, or the pytest process running checks itself): its results
    # are cached here.
    install_cache(ctx, options.cache)
    use_target_command(options.target_command)
    return ctx


def _fingerprint(program: ExportedProgram) -> tuple[list[tuple], dict[str, torch.Tensor]]:
    # The nodes themselves, not graph_module.code: an edit of the graph without
    # recompile() leaves the code as it was. Tensors are copied: they are what
    # a backend might write to.
    return _graph_structure(program), {k: v.detach().clone() for k, v in program.state_dict.items()}


def _graph_structure(program: ExportedProgram) -> list[tuple]:
    return [(n.name, n.op, str(n.target), str(n.args), str(n.kwargs)) for n in walk_nodes(program.graph_module)]


#: How input values are drawn: uniform in range, the range's edge values, or both mixed.
INPUT_MODES = ("random", "edges", "mixed")


def make_input(
    spec: TensorInput | object, dtype: str, generator: torch.Generator, mode: str = "random", sizes: dict | None = None
) -> torch.Tensor | object:
    """One input from a `TensorInput` (drawn from ``generator``) or a constant.

    ``sizes`` gives the size of each `Dim` in the shape (default ``max(2, min)``).

    ``edges`` fills the tensor with the boundary values of its range (low,
    high, 0, ±1, a tiny number, where they lie in the range); ``mixed``
    puts such values into a random tensor.
    """
    if not isinstance(spec, TensorInput):
        return spec
    shape = spec.concrete_shape(sizes)
    name = dtype if spec.dtype == "float" else spec.dtype
    torch_dtype = getattr(torch, "float32" if name == FIXED else name)
    if torch_dtype == torch.bool:
        if mode == "edges":
            return torch.full(shape, bool(torch.randint(0, 2, (), generator=generator)))
        return torch.randint(0, 2, shape, generator=generator).bool()
    floating = torch_dtype.is_floating_point
    low = spec.low if spec.low is not None else (-1.0 if floating else -100)
    high = spec.high if spec.high is not None else (1.0 if floating else 100)
    if floating:
        values = torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low
    else:
        values = torch.randint(int(low), int(high) + 1, shape, generator=generator, dtype=torch.float64)
    if mode != "random" and values.numel():
        edges = [v for v in (low, high, 0.0, -0.0, 1.0, -1.0, 1e-3, -1e-3) if low <= v <= high]
        if not floating:
            edges = sorted({float(int(v)) for v in edges})
        pick = torch.randint(0, len(edges), shape, generator=generator)
        edge_values = torch.tensor(edges, dtype=torch.float64)[pick]
        if mode == "edges":
            values = edge_values
        else:
            mask = torch.rand(shape, generator=generator) < 0.3
            values = torch.where(mask, edge_values, values)
    return values.to(torch_dtype)
