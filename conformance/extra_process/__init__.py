"""The suite's extra process: a target-side process (host-only modules blocked) that loads the
availability and serialization categories' archives, and lowers afresh where a check needs it.

``handler`` runs inside that process; ``stand_in`` puts an availability row into effect there.
"""

from ._process import session
from .stand_in import StandIn

__all__ = ["StandIn", "session"]
