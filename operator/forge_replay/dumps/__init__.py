"""slime/miles rollout dumps: the Sample model, a safe C-speed loader, save, packed format, synth, verify.

``load(path)`` never executes pickled code (allowlist unpickler) and reads packed dumps transparently;
``save(path, rollout_id, samples)`` writes slime's exact ``torch.save`` format.
"""

from forge_replay.dumps.files import Dump, load, load_raw, save
from forge_replay.dumps.safe_pickle import DumpError, safe_load
from forge_replay.dumps.sample import Sample, SampleError

__all__ = ["Dump", "DumpError", "Sample", "SampleError", "load", "load_raw", "safe_load", "save"]
