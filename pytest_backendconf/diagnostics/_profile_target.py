"""`profile_on_target`: the timed calls of `profile` made on a target (a device, with a target command).

The archive travels to the target as bytes (`target.open_child`: the same
link as ``run-target``); the target loads it with its host-only modules
blocked and times each call (`ProfileHandler`). Only the timings come back:
the host, which read the archive (and its ``.debug`` file), owns the debug
info that turns them into rows by source line, op and module. So a
handles-only archive needs no sidecar on the device.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ._profile import Call, Profile, _top_class

if TYPE_CHECKING:
    from ..archive import Archive
    from ..target import Channel

HANDLER = "pytest_backendconf.diagnostics._profile_target:ProfileHandler"


def profile_on_target(
    path: str | os.PathLike,
    archive: Archive,
    calls: Mapping[str, Sequence[tuple]],
    *,
    repeat: int,
    plugins: Sequence[str] | None = (),
    blocked: Sequence[str] = (),
    timeout: float = 600,
) -> list[tuple[str, int, Profile]]:
    """``(method, input list index, Profile)`` of every call list, timed on the target.

    :param archive: ``path`` as read here (`read_archive`, with its sidecar), whose debug info the rows use.
    :raises BackendConfError: the target could not load the archive or a call failed (the target's message),
        or the link broke (``TargetUnreachable``: then not the backend's failure).
    """
    from ..debuginfo import hierarchy_prefix
    from ..errors import BackendConfError, TargetUnreachable
    from ..target import Ended, blocked_modules, open_child, pack_value, tail_text, target_capabilities

    child = open_child(
        HANDLER,
        blocked=blocked_modules(target_capabilities(archive.backend_name), blocked),
        plugins=plugins,
        startup_timeout=timeout,
        refuse_tracing=True,
        on_target=True,
    )
    try:
        reply = child.request(
            {
                "archive": child.file(path),
                "calls": pack_value({m: [tuple(a) for a in c] for m, c in calls.items()}, "profile inputs"),
                "repeat": repeat,
            },
            timeout=timeout,
        )
    finally:
        child.close()
    if isinstance(reply, Ended):
        if reply.unreachable:
            raise TargetUnreachable(f"{reply.unreachable} (profiling {os.fspath(path)!r})")
        if reply.setup_error is not None:
            raise BackendConfError(f"{reply.setup_error['type']}: {reply.setup_error['message']}")
        raise BackendConfError(
            f"the target process {reply.describe()} while profiling {os.fspath(path)!r}; "
            f"stderr: {tail_text(reply.stderr)}"
        )
    if reply["error"] is not None:
        error = reply["error"]
        raise BackendConfError(f"the target could not profile {os.fspath(path)!r}: {error['type']}: {error['message']}")
    separate = archive.separate_debug_record() if archive.separate_debug is not None and not archive.debug else None
    profiles = []
    for method, lists in reply["profiles"].items():
        for i, timed in enumerate(lists):
            profiles.append(
                (
                    method,
                    i,
                    Profile(
                        method=method,
                        backend=reply["backend"],
                        calls=tuple(Call(s, e, None if ev is None else tuple(map(tuple, ev))) for s, e, ev in timed),
                        debug=archive.debug,
                        top=hierarchy_prefix((("top", _top_class(archive.debug, method)),), method),
                        hint=separate["hint"] if separate is not None else None,
                    ),
                )
            )
    return profiles


class ProfileHandler:
    """On the target: load the archive (blocker in place) and time each call list ``repeat`` times."""

    def __init__(self, options: Mapping[str, Any], channel: Channel) -> None:
        self.channel = channel

    def __call__(self, request: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
        from ..archive import read_archive
        from ..lowering import instantiate
        from ..target import call_on_target, error_record, load_on_target, prepare_target, unpack_value
        from ._profile import profile

        reply: dict[str, Any] = {"backend": None, "profiles": {}, "error": None}
        try:
            archive = read_archive(request["archive"])
            reply["backend"] = archive.backend_name
            prepare_target(self.channel, archive.backend_name)
            loaded = load_on_target(self.channel, lambda: instantiate(archive))
            for method, arg_lists in unpack_value(request["calls"], "profile inputs").items():
                for args in arg_lists:
                    timed = call_on_target(
                        self.channel,
                        lambda *a, m=method: profile(loaded, *a, repeat=int(request["repeat"]), method=m),
                        args,
                    )
                    reply["profiles"].setdefault(method, []).append(
                        [
                            [c.start_ns, c.end_ns, None if c.events is None else [list(e) for e in c.events]]
                            for c in timed.calls
                        ]
                    )
        except Exception as exc:
            reply["error"] = error_record(exc)
        return reply
