"""TEST ONLY: ``python -m sglang.launch_server`` in the sglang stand-in image (tests/cluster/images.py).

sglang's engine needs CUDA and the real node has none. This module, installed as ``sglang/launch_server.py`` in a
layer over the runtime image, runs the sglang test double (``tests/doubles/sglang_double.py``, copied next to it
under ``/opt/forge-replay-test/doubles``) with the argv the runtime gave: so the product's own engine command,
unchanged, starts a server that speaks sglang 0.5.23's HTTP API. The double records its calls under
``$SGLANG_DOUBLE_RECORD_DIR`` when that is set (the scenario points it at the results volume).
"""

import runpy
import socket
import sys

DOUBLE = "/opt/forge-replay-test/doubles/sglang_double.py"
SAID = "sglang stand-in (TEST ONLY): python -m sglang.launch_server"

if __name__ == "__main__":
    # The first line of the engine's log: what started it (the runtime's own command, not --engine-command), in
    # which pod (a pod's hostname is its name).
    print(f"{SAID} {' '.join(sys.argv[1:])} (in pod {socket.gethostname()})", flush=True)
    sys.argv[0] = DOUBLE
    runpy.run_path(DOUBLE, run_name="__main__")
