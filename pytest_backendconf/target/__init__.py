"""The target side: child processes, and loading an archive where host-only modules are blocked.

Owns the one way the package runs work in another interpreter (the message protocol, the import
blocker) and the simulated target of the availability tables.

May import: `lowering`, `archive`, `debuginfo`, `reference`, `registry` and the public surface.
"""

from ._child import (
    Channel,
    ChildProcess,
    Ended,
    active_plugins,
    error_record,
    exit_status,
    import_plugins,
    pack_value,
    tail_text,
    unpack_value,
)
from ._device import versions
from ._link import COMMAND_ENV as TARGET_COMMAND_ENV
from ._link import (
    MAX_FRAME_BYTES,
    DeviceChild,
    TargetLink,
    current_link,
    mask_command,
    open_child,
    probe,
    target_command,
    use_target_command,
)
from ._replay import BundleResult, replay_archives
from ._target import (
    blocked_modules,
    call_on_target,
    load_on_target,
    prepare_target,
    run_on_target,
    target_capabilities,
)

__all__ = [
    "blocked_modules",
    "current_link",
    "DeviceChild",
    "mask_command",
    "MAX_FRAME_BYTES",
    "open_child",
    "probe",
    "target_command",
    "TargetLink",
    "TARGET_COMMAND_ENV",
    "use_target_command",
    "versions",
    "BundleResult",
    "Channel",
    "ChildProcess",
    "Ended",
    "active_plugins",
    "call_on_target",
    "error_record",
    "exit_status",
    "import_plugins",
    "load_on_target",
    "pack_value",
    "prepare_target",
    "replay_archives",
    "run_on_target",
    "target_capabilities",
    "tail_text",
    "unpack_value",
]
