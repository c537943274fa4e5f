"""What the safe loader raises when a pickle asks for something a rollout dump may not do.

Both the loader (:mod:`forge_replay.dumps.safe_pickle`) and the inert stand-ins it hands out
(:mod:`forge_replay.dumps.inert`) refuse with it.
"""

from __future__ import annotations

import pickle


class Refused(pickle.UnpicklingError):
    """The pickle asks for something a dump may not do (a global, an attribute write, a foreign dtype)."""
