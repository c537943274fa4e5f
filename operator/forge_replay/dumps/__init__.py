"""slime/miles rollout dumps: the Sample model, a safe C-speed loader, save, packed format, synth, verify.

``load(path)`` never executes pickled code (allowlist unpickler) and reads packed dumps transparently;
``save(path, rollout_id, samples)`` writes slime's exact ``torch.save`` format.

Names are resolved lazily, so ``from forge_replay.dumps import Sample`` (or the CLI's --help)
does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge_replay.lazy import lazy_exports

_EXPORTS = {
    "Dump": "forge_replay.dumps.files",
    "load": "forge_replay.dumps.files",
    "load_raw": "forge_replay.dumps.files",
    "save": "forge_replay.dumps.files",
    "DumpError": "forge_replay.dumps.safe_pickle",
    "safe_load": "forge_replay.dumps.safe_pickle",
    "Sample": "forge_replay.dumps.sample",
    "SampleError": "forge_replay.dumps.sample",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from forge_replay.dumps.files import Dump, load, load_raw, save
    from forge_replay.dumps.safe_pickle import DumpError, safe_load
    from forge_replay.dumps.sample import Sample, SampleError

__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
