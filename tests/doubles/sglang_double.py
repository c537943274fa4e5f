"""TEST DOUBLE for an sglang HTTP server (sglang needs CUDA; the CPU machines here cannot run it).

This is a real HTTP server process that speaks the part of sglang's HTTP API forge-replay calls,
and records every request, so tests can check what the engines were sent. It is launched exactly
as ``python -m sglang.launch_server`` would be (``forge-replay run --engine-command "python
tests/doubles/sglang_double.py --record-dir DIR"``): the double's own flags (below) are taken out with
``parse_known_args``; the rest is sglang's argv, parsed by sglang's own ``prepare_server_args`` when sglang is
installed (``tests/doubles/real_sglang.py``; an argv sglang refuses fails the start), else by a fallback argparse
that records flags it does not know (one warning line says so).

It answers as sglang ``--sglang-version`` does (0.5.23, the pinned version, by default; 0.5.19 too), each
behaviour citing the sglang source it follows (paths under ``python/sglang/srt/``):
- start: no tokenizer under ``--tokenizer-path`` (default: the model path) and no ``--skip-tokenizer-init``
  -> exit 1 before listening (``managers/tokenizer_manager.py``);
- weight-update sessions (0.5.23): ``/update_weights_from_distributed`` and ``/update_weights_from_tensor``
  are refused with 400 before anything is received unless ``POST /begin_weight_update {}`` opened a session,
  closed by ``POST /end_weight_update {}`` (``managers/scheduler_components/weight_updater.py``); 0.5.19 has
  no such routes (404) and no such check;
- ``/update_weights_from_disk`` without ``load_format`` uses the server's ``--load-format``; ``dummy`` (or any
  non-default loader) is refused with 400 "Failed to get model loader"
  (``model_executor/model_runner_components/weight_updater.py``);
- the weight version is read from ``GET /model_info`` or ``/get_model_info``; ``/get_weight_version`` is 404
  (``entrypoints/http_server.py``);
- ``/release_memory_occupation`` releases nothing without ``--enable-memory-saver``
  (``utils/torch_memory_saver_adapter.py``), noted in the call log;
- the weight group is formed with sglang's own ``init_custom_process_group`` when sglang is installed
  (``utils/common.py``).
- out of memory, on a stand-in GPU of ``--double-gpu-memory-gib G`` (or ``$SGLANG_DOUBLE_GPU_MEMORY_GIB``;
  ``tests/doubles/sglang_memory.py``): the KV cache that does not fit at ``--mem-fraction-static`` after the
  model's weights is refused at start with sglang's own exception (``mem_cache/kv_cache_configurator.py:3043-3058``,
  ``model_executor/pool_configurator.py:94-99``), and a forward pass (``/generate``, ``/health_generate``) that
  needs more than stays free raises torch's CUDA OOM; either way the process ends as sglang's does, the
  "Scheduler hit an exception:" block and the SIGQUIT line in its log, then SIGKILL (returncode -9;
  ``managers/scheduler.py:6370-6373``, ``utils/common.py:2551-2554``). A ``/update_weights_from_distributed``
  bucket that does not fit is answered 400 "Failed to receive weights: CUDA out of memory ..." as 0.5.23 catches it
  (``managers/scheduler_components/weight_updater.py:201-211``).

Records (JSON, under ``--record-dir`` or ``$SGLANG_DOUBLE_RECORD_DIR``, one set per port):
- ``start-<port>.json``: pid, pgid, argv, ``sglang_version``, ``sglang_parser`` ("real <version>" or
  "fallback"), the parsed args and the unknown ones (the latest start; ``starts-<port>.jsonl`` keeps every
  start on that port, e.g. after a recovery), and ``memory``: the stand-in GPU's budget (device, weights, cell
  size, tokens, what stays free) and the refusal, if any;
- ``calls-<port>.jsonl``: one line per request: time, method, path, status answered, JSON body (plus
  ``received`` and the double's ``double`` notes: memory released or not, how the weight group was formed);
- ``stop-<port>.json``: written when it is stopped by SIGTERM/SIGINT.

Weights it receives are really received, so tests can compare them with the trainer's: the disk path
reads the safetensors files, the distributed path joins the weight-sync process group (gloo, as
sglang's engines join theirs: gloo, or NCCL on its --base-gpu-id when CUDA is there; TP 1 only: the
double is one process) and receives every broadcast.
The tensor path decodes every TP rank's entry with ``tensor_payload.py`` (a restricted unpickler; CUDA
IPC handles are opened on the GPU their UUID names), and adds names, shapes, dtypes, devices and
``abs_sums`` (one per entry). All add ``"received": {"tensors": N, "abs_sum": S}`` to the answer and to the
call log.

Endpoints with a double-only prefix let a test make it misbehave:
``POST /_double/health {"healthy": false}`` makes /health_generate answer 503. Flags do the same from the
start: ``--missing-endpoint PATH`` (404), ``--pin-weight-version``, ``--die-during-broadcast K`` (exit in the
middle of the K-th distributed bucket), ``--die-during-disk-push K``, ``--die-on-version-check``,
``--refuse-group-join`` and ``--refuse-bucket K`` (receive it, then answer 400 ``success: false``, as sglang
does when its load fails).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


SGLANG_VERSIONS = ("0.5.23", "0.5.19")
"""The sglang versions whose behaviour the double follows (``--sglang-version``): 0.5.23 is the pinned one."""

SESSIONS_SINCE = (0, 5, 21)
"""Weight-update sessions (``/begin_weight_update``, ``/end_weight_update``) exist from 0.5.21 on
(``python/sglang/srt/managers/scheduler_components/weight_updater.py``; 0.5.19 has neither route nor check)."""

DEFAULT_LOADER_FORMATS = ("auto", "pt", "safetensors")
"""Load formats sglang's ``update_weights_from_disk`` accepts: only ``DefaultModelLoader`` formats; ``dummy`` and
the rest get "Failed to get model loader" (``python/sglang/srt/model_executor/model_runner_components/
weight_updater.py``, 0.5.19 and 0.5.23; ``get_model_loader`` in ``model_loader/loader.py``)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
"""What transformers' AutoTokenizer loads a tokenizer from; sglang loads one from ``--tokenizer-path`` (default:
the model path) at start unless ``--skip-tokenizer-init`` (``python/sglang/srt/managers/tokenizer_manager.py``,
0.5.19 and 0.5.23), and dies without one."""

SERVER_FIELDS = ("host", "port", "model_path", "tokenizer_path", "load_format", "tp_size", "base_gpu_id",
                 "skip_server_warmup", "skip_tokenizer_init", "enable_memory_saver", "dtype", "weight_version",
                 "mem_fraction_static", "page_size", "kv_cache_dtype")
"""The sglang ServerArgs fields the double acts on (names as in ``python/sglang/srt/server_args.py``)."""


def double_parser() -> argparse.ArgumentParser:
    """The double's own flags; everything else on the command line is sglang's."""
    parser = argparse.ArgumentParser(prog="sglang_double", add_help=True)
    parser.add_argument("--record-dir", default=os.environ.get("SGLANG_DOUBLE_RECORD_DIR"))
    parser.add_argument("--sglang-version", choices=SGLANG_VERSIONS, default=SGLANG_VERSIONS[0],
                        help="the sglang version to answer as (double only)")
    parser.add_argument(
        "--startup-delay", type=float, default=0.0, help="seconds to wait before listening (double only)"
    )
    parser.add_argument(
        "--missing-endpoint", action="append", default=[],
        help="answer 404 on this path, like a minimal stand-in server (double only; repeatable)",
    )
    parser.add_argument(
        "--health-generate-seconds", type=float, default=0.0, metavar="S",
        help="/health_generate takes S seconds to answer, as sglang's may take up to 20 s (its one-token generation, "
             "HEALTH_CHECK_TIMEOUT in python/sglang/srt/entrypoints/http_server.py) (double only)",
    )
    parser.add_argument(
        "--pin-weight-version", action="store_true",
        help="accept weight updates but never change the reported version (double only)",
    )
    parser.add_argument(
        "--die-during-broadcast", type=int, default=0, metavar="K",
        help="on the K-th /update_weights_from_distributed request, exit (code 17) after the first tensor of the "
             "bucket arrived, in the middle of the broadcast; only the first engine of the record dir to get there "
             "dies: the others, and the engine restarted after it, behave (double only)",
    )
    parser.add_argument(
        "--die-during-disk-push", type=int, default=0, metavar="K",
        help="exit (code 17) on the K-th /update_weights_from_disk request, before answering; the first engine "
             "of the record dir only, as --die-during-broadcast (double only)",
    )
    parser.add_argument(
        "--die-on-version-check", action="store_true",
        help="the first engine of the record dir to get /model_info exits (code 17) instead of answering: "
             "it took the weights, then died (double only)",
    )
    parser.add_argument(
        "--refuse-group-join", action="store_true",
        help="the first engine of the record dir to get /init_weights_update_group answers 400 {success: false} "
             "without joining, as sglang does when its process group cannot be made; the others join (double only)",
    )
    parser.add_argument(
        "--double-gpu-memory-gib", type=float, metavar="G",
        default=float(os.environ.get("SGLANG_DOUBLE_GPU_MEMORY_GIB") or 0) or None,
        help="the size of the stand-in GPU (or $SGLANG_DOUBLE_GPU_MEMORY_GIB): the engine's memory is then "
             "budgeted as sglang 0.5.23 budgets it, and what does not fit is refused as sglang refuses it "
             "(tests/doubles/sglang_memory.py); without it, nothing is refused for lack of memory (double only)",
    )
    parser.add_argument(
        "--refuse-bucket", type=int, default=0, metavar="K",
        help="receive the K-th /update_weights_from_distributed bucket, then answer 400 {success: false} as "
             "sglang does when loading it fails (double only)",
    )
    return parser


def fallback_server_parser() -> argparse.ArgumentParser:
    """sglang's launch_server flags the double acts on, when sglang's own parser is not there (see
    :func:`real_sglang`); flags it does not know are recorded as unknown."""
    parser = argparse.ArgumentParser(prog="sglang_double (fallback sglang parser)", add_help=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tokenizer-path", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--base-gpu-id", type=int, default=0)
    parser.add_argument("--skip-server-warmup", action="store_true")
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--enable-memory-saver", action="store_true")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--page-size", type=int, default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    return parser


_REAL_SGLANG = None


def real_sglang():
    """tests/doubles/real_sglang.py (sglang's own parser and process group, when sglang is installed), loaded by
    path since this file runs as a script; None when that module is not there or sglang is not installed."""
    global _REAL_SGLANG
    if _REAL_SGLANG is None:
        import importlib.util

        path = Path(__file__).with_name("real_sglang.py")
        module = False
        if path.is_file():
            spec = importlib.util.spec_from_file_location("sglang_double_real_sglang", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            if not module.available():
                module = False
        _REAL_SGLANG = module
    return _REAL_SGLANG or None


_MEMORY = None


def sglang_memory():
    """tests/doubles/sglang_memory.py (the stand-in GPU), loaded by path since this file runs as a script."""
    global _MEMORY
    if _MEMORY is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("sglang_double_memory", Path(__file__).with_name("sglang_memory.py"))
        _MEMORY = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = _MEMORY
        spec.loader.exec_module(_MEMORY)
    return _MEMORY


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The double's flags plus the sglang ServerArgs fields it acts on (:data:`SERVER_FIELDS`), and the sglang
    flags left unparsed. sglang's argv is parsed by sglang's own ``prepare_server_args`` when sglang is
    installed (a flag it does not know then fails the start, as it fails sglang's); else by
    :func:`fallback_server_parser`, said in one warning line. ``sglang_parser`` records which."""
    args, rest = double_parser().parse_known_args(argv)
    real = real_sglang()
    if real is not None:
        server = real.parse_server_args(rest)
        fields = {name: getattr(server, name) for name in SERVER_FIELDS}
        args.sglang_parser, unknown = f"real {real.VERSION}", []
    else:
        print("sglang_double: sglang's own argument parser is not available (no sglang, or no "
              "tests/doubles/real_sglang.py): parsing sglang's flags with the double's fallback parser",
              file=sys.stderr, flush=True)
        server, unknown = fallback_server_parser().parse_known_args(rest)
        fields = {name: getattr(server, name) for name in SERVER_FIELDS}
        args.sglang_parser = "fallback"
    fields["tokenizer_path"] = fields["tokenizer_path"] or fields["model_path"]
    for name, value in fields.items():
        setattr(args, name, value)
    return args, unknown


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def start_problem(args: argparse.Namespace) -> str | None:
    """Why sglang would die at start with these arguments: no tokenizer where it loads one from."""
    if args.skip_tokenizer_init:
        return None
    tokenizer_dir = Path(args.tokenizer_path)
    if any((tokenizer_dir / name).is_file() for name in TOKENIZER_FILES):
        return None
    return (f"no tokenizer in {tokenizer_dir} ({', '.join(TOKENIZER_FILES)}) and no --skip-tokenizer-init: sglang "
            "loads the tokenizer at start (python/sglang/srt/managers/tokenizer_manager.py) and exits here")


class DoubleState:
    """What the double remembers: weight version, memory state, health switch, and the call log."""

    def __init__(self, args: argparse.Namespace, unknown: list[str]):
        self.args = args
        self.unknown = unknown
        self.weight_version = args.weight_version
        self.model_path = args.model_path
        self.memory_released = False
        self.session_open = False
        self.sessions = version_tuple(args.sglang_version) >= SESSIONS_SINCE
        self.routes = routes_for(args.sglang_version)
        self.generation_paused = False
        self.healthy = True
        self.lock = threading.Lock()
        self.weight_groups: dict[str, object] = {}
        self.distributed_requests = 0
        self.disk_requests = 0
        self.weight_group_devices: dict[str, str] = {}
        self.record_dir = Path(args.record_dir) if args.record_dir else None
        self.memory = None
        """The stand-in GPU's budget (``sglang_memory.DeviceMemory``) with ``--double-gpu-memory-gib``."""
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)

    def record_file(self, kind: str, suffix: str) -> Path | None:
        if self.record_dir is None:
            return None
        return self.record_dir / f"{kind}-{self.args.port}.{suffix}"

    def record_call(self, method: str, path: str, body: object, status: int) -> None:
        target = self.record_file("calls", "jsonl")
        if target is None:
            return
        line = json.dumps({"time": time.time(), "method": method, "path": path, "status": status, "body": body})
        with self.lock, open(target, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    def write_json(self, kind: str, payload: dict) -> None:
        target = self.record_file(kind, "json")
        if target is not None:
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload, indent=1))
            tmp.replace(target)


def make_handler(state: DoubleState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            return  # the call log is the record; keep stderr quiet

        def _body(self) -> object:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return None
            raw = self.rfile.read(length)
            try:
                return json.loads(raw)
            except ValueError:
                return raw.decode("utf-8", "replace")

        def _send(self, status: int, payload: object) -> None:
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            self._dispatch("GET", None)

        def do_POST(self) -> None:  # noqa: N802 - stdlib naming
            self._dispatch("POST", self._body())

        def _dispatch(self, method: str, body: object) -> None:
            path = self.path.split("?", 1)[0]
            handler = None if path in state.args.missing_endpoint else state.routes.get(path)
            if handler is None:
                state.record_call(method, path, body, 404)
                self._send(404, {"error": f"the sglang double does not implement {method} {path}"})
                return
            note = None
            try:
                status, payload, *rest = handler(state, body if isinstance(body, dict) else {})
                note = rest[0] if rest else None
            except Exception as exc:  # noqa: BLE001 - answer like a server would, and say what failed
                status, payload = 500, {"success": False, "message": f"{type(exc).__name__}: {exc}"}
            received = payload.get("received") if isinstance(payload, dict) else None
            extra = {**({"received": received} if received is not None else {}), **({"double": note} if note else {})}
            state.record_call(method, path, {**(body or {}), **extra} if extra else body, status)
            self._send(status, payload)

    return Handler


def _health(state: DoubleState, body: dict) -> tuple[int, object]:
    return (200, "") if state.healthy else (503, "unhealthy (set by the test double's control endpoint)")


def _health_generate(state: DoubleState, body: dict) -> tuple[int, object]:
    if state.args.health_generate_seconds:
        time.sleep(state.args.health_generate_seconds)
    if state.memory_released:
        return 503, "memory released: resume it before generating"
    # sglang's /health_generate generates one token from input_ids [0] (python/sglang/srt/entrypoints/http_server.py)
    _forward(state, "/health_generate", tokens=1, sequences=1)
    return _health(state, body)


def _forward(state: DoubleState, path: str, *, tokens: int, sequences: int) -> None:
    """A forward pass of ``tokens`` tokens in ``sequences`` sequences on the stand-in GPU: one that needs more than
    stays free kills the server as sglang's uncaught scheduler exception does, the request left open
    (tests/doubles/sglang_memory.py); the decision goes to the call log first."""
    memory = state.memory
    if memory is None:
        return
    module = sglang_memory()
    need = module.forward_bytes(memory, tokens, sequences)
    if need <= memory.free_bytes:
        return
    in_use = memory.device_bytes - memory.free_bytes
    error = module.cuda_out_of_memory(memory, need, state.args.base_gpu_id or 0, in_use)
    state.record_call("POST", path, {"double": {"out_of_memory": {
        "requested_bytes": need, "free_bytes": memory.free_bytes, "tokens": tokens, "sequences": sequences,
        "refusal": f"{type(error).__module__}.{type(error).__name__}: {error}"}}}, None)
    module.die_like_sglang(error, serving=True)


def _batch(body: dict) -> tuple[int, int]:
    """(tokens, sequences) of a /generate body: ``input_ids`` (one list or a batch of lists) or ``text`` (one
    string or a list; a token per byte, the double having no tokenizer)."""
    ids = body.get("input_ids")
    if ids is not None:
        batch = ids if ids and isinstance(ids[0], list) else [ids]
        return sum(len(sequence) for sequence in batch), len(batch)
    text = body.get("text") or ""
    batch = text if isinstance(text, list) else [text]
    return sum(max(1, len(str(t).encode())) for t in batch), len(batch)


def _flush_cache(state: DoubleState, body: dict) -> tuple[int, object]:
    return 200, "Cache flushed."


def _model_info(state: DoubleState, body: dict) -> tuple[int, object]:
    """``GET /model_info`` (and the deprecated ``/get_model_info``, same answer): the served model and its
    ``weight_version`` (python/sglang/srt/entrypoints/http_server.py, 0.5.19 and 0.5.23; both answer
    ``/get_weight_version`` 404, so the double has no such route)."""
    if state.args.die_on_version_check and _first_death(state):
        os._exit(17)
    return 200, {"model_path": state.model_path, "tokenizer_path": state.args.tokenizer_path, "is_generation": True,
                 "weight_version": state.weight_version, "load_format": state.args.load_format}


def _update_weights_from_disk(state: DoubleState, body: dict) -> tuple[int, object]:
    """A body without ``load_format`` loads with the server's own (python/sglang/srt/managers/tokenizer_manager.py,
    ``update_weights_from_disk``), and only default-loader formats load (:data:`DEFAULT_LOADER_FORMATS`): a server
    started with ``--load-format dummy`` refuses such a body with 400 ``success: false``."""
    load_format = body.get("load_format") or state.args.load_format
    if load_format not in DEFAULT_LOADER_FORMATS:
        return 400, {"success": False, "message": f"Failed to get model loader: {load_format} loader (refused by the "
                                                  "sglang double as sglang's update_weights_from_disk refuses it).",
                     "num_paused_requests": 0}
    model_path = body.get("model_path")
    if not model_path or not Path(model_path).is_dir():
        return 400, {"success": False, "message": f"model_path {model_path!r} is not a directory"}
    if not any(Path(model_path).glob("*.safetensors")):
        return 400, {"success": False, "message": f"no *.safetensors under {model_path}"}
    if state.memory_released:
        return 400, {"success": False, "message": "memory released: resume it before updating weights"}
    with state.lock:
        state.disk_requests += 1
        number = state.disk_requests
    if number == state.args.die_during_disk_push and _first_death(state):
        os._exit(17)
    received = _checkpoint_summary(Path(model_path))
    state.model_path = model_path
    if body.get("weight_version") is not None and not state.args.pin_weight_version:
        state.weight_version = str(body["weight_version"])
    return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0,
                 "received": received}


def _checkpoint_summary(directory: Path) -> dict | None:
    """Tensor count and sum of absolute values of a safetensors checkpoint (None without torch)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        return None
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return {"tensors": len(tensors), "abs_sum": sum(float(t.double().abs().sum()) for t in tensors.values())}


def _init_weights_update_group(state: DoubleState, body: dict) -> tuple[int, object, dict]:
    """Join the trainer's weight-sync group with sglang's own ``init_custom_process_group``
    (python/sglang/srt/utils/common.py) when sglang is installed, else the way it does (a TCP store under the
    group's name); the call log says which."""
    if state.args.tp_size != 1:
        return 400, {"success": False, "message": "the double joins weight groups with --tp-size 1 only"}
    if state.args.refuse_group_join and _first_death(state):
        return 400, {"success": False, "message": "Failed to init weights update group: refused by the sglang double "
                                                  "(--refuse-group-join)"}
    import torch

    backend = body.get("backend")
    if backend == "nccl" and torch.cuda.is_available():
        device = f"cuda:{state.args.base_gpu_id}"
        torch.cuda.set_device(device)
    elif backend == "gloo":
        device = "cpu"
    else:
        return 400, {"success": False, "message": f"the double joins gloo groups, or nccl ones with CUDA, not {backend}"}
    name, rank, world_size = body["group_name"], int(body["rank_offset"]), int(body["world_size"])
    init_method = f"tcp://{body['master_address']}:{body['master_port']}"
    real = real_sglang()
    if real is not None:
        group = real.init_weight_group(backend=backend, init_method=init_method, world_size=world_size, rank=rank,
                                       group_name=name, timeout_s=60)
        made_by = f"sglang {real.VERSION} init_custom_process_group"
    else:
        group, made_by = _own_weight_group(backend, init_method, world_size, rank, name, 60), "fallback"
    state.weight_groups[name] = group
    state.weight_group_devices[name] = device
    return 200, {"success": True, "message": f"joined {name} as rank {rank} of {world_size}"}, {"group": made_by}


def _own_weight_group(backend: str, init_method: str, world_size: int, rank: int, name: str, timeout_s: float):
    """A process group formed as sglang's ``init_custom_process_group`` forms one, without sglang installed."""
    import datetime

    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(name, store),
                                         group_name=name, timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def _destroy_weights_update_group(state: DoubleState, body: dict) -> tuple[int, object]:
    import torch.distributed as dist

    group = state.weight_groups.pop(body.get("group_name"), None)
    if group is None:
        return 400, {"success": False, "message": f"no weight group {body.get('group_name')!r}"}
    dist.destroy_process_group(group)
    return 200, {"success": True, "message": ""}


def _session_refusal(state: DoubleState, path: str) -> tuple[int, object] | None:
    """sglang >= 0.5.21 refuses a distributed or tensor update outside a weight-update session with 400, before
    receiving anything (python/sglang/srt/managers/scheduler_components/weight_updater.py, 0.5.23)."""
    if state.sessions and not state.session_open:
        return 400, {"success": False, "message": f"{path.strip('/')} must run between begin_weight_update() and "
                                                  "end_weight_update()"}
    return None


def _begin_weight_update(state: DoubleState, body: dict) -> tuple[int, object]:
    """Open the weight-update session; a second one is refused (weight_updater.py, 0.5.23)."""
    if state.session_open:
        return 400, {"success": False, "message": "a weight-update session is already open; call "
                                                  "end_weight_update() first"}
    state.session_open = True
    return 200, {"success": True, "message": "Success"}


def _end_weight_update(state: DoubleState, body: dict) -> tuple[int, object]:
    """Close the weight-update session; none open is refused (weight_updater.py, 0.5.23)."""
    if not state.session_open:
        return 400, {"success": False, "message": "no weight-update session is open; call begin_weight_update() first"}
    state.session_open = False
    return 200, {"success": True, "message": "Success"}


def _update_weights_from_distributed(state: DoubleState, body: dict) -> tuple[int, object]:
    """Receive one bucket by broadcast from rank 0 of the named group, in the announced order."""
    import torch
    import torch.distributed as dist

    refused = _session_refusal(state, "/update_weights_from_distributed")
    if refused is not None:
        return refused
    group = state.weight_groups.get(body.get("group_name"))
    if group is None:
        return 400, {"success": False, "message": f"no weight group {body.get('group_name')!r}: init it first"}
    with state.lock:
        state.distributed_requests += 1
        number = state.distributed_requests
    die = number == state.args.die_during_broadcast and _first_death(state)
    abs_sum, allocated = 0.0, 0
    for dtype, shape in zip(body["dtypes"], body["shapes"], strict=True):
        allocated += _element_count(shape) * getattr(torch, dtype).itemsize
        refused = _bucket_refusal(state, allocated)
        if refused is not None:
            return refused
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=state.weight_group_devices[body["group_name"]])
        dist.broadcast(tensor, src=0, group=group)
        abs_sum += float(tensor.double().abs().sum())
        if die:
            os._exit(17)  # mid-broadcast: the trainer is still sending this bucket's other tensors
    if number == state.args.refuse_bucket:
        # sglang receives the whole bucket, then reports the failed load (its weights are now partly updated),
        # with HTTP 400 as its /update_weights_from_distributed answers every success: false
        return 400, {"success": False, "message": f"Failed to update parameter online: bucket {number} refused by "
                                                  "the sglang double (--refuse-bucket)"}
    if body.get("weight_version") is not None and not state.args.pin_weight_version:
        state.weight_version = str(body["weight_version"])
    return 200, {"success": True, "message": "", "received": {"tensors": len(body["names"]), "abs_sum": abs_sum}}


def _element_count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def _bucket_refusal(state: DoubleState, allocated: int) -> tuple[int, object, dict] | None:
    """sglang allocates every tensor of a bucket on the device before receiving it
    (python/sglang/srt/model_executor/model_runner_components/weight_updater.py:281-297); the allocation that does
    not fit in what stays free raises torch's OutOfMemoryError, which 0.5.23 catches and answers as a failed update
    (managers/scheduler_components/weight_updater.py:201-211, HTTP 400): the engine lives on, and the trainer's
    broadcast of the tensors it never received waits for it (tests/doubles/sglang_memory.py)."""
    memory = state.memory
    if memory is None or allocated <= memory.free_bytes:
        return None
    module = sglang_memory()
    error = module.cuda_out_of_memory(memory, allocated, state.args.base_gpu_id or 0,
                                      memory.device_bytes - memory.free_bytes)
    message = f"Failed to receive weights: {error}"
    print(f"{module._stamp()} {message}", file=sys.stderr, flush=True)
    return 400, {"success": False, "message": message}, {"out_of_memory": {
        "requested_bytes": allocated, "free_bytes": memory.free_bytes}}


def _first_death(state: DoubleState) -> bool:
    """True for the first engine of the record dir to get there (a marker file) to misbehave: the others, and an
    engine restarted after it, behave."""
    if state.record_dir is None:
        return True
    marker = state.record_dir / "died.marker"
    try:
        marker.open("x").close()
    except FileExistsError:
        return False
    return True


def _update_weight_version(state: DoubleState, body: dict) -> tuple[int, object]:
    state.weight_version = str(body.get("new_version"))
    return 200, {"success": True, "message": ""}


def _succeed(state: DoubleState, body: dict) -> tuple[int, object]:
    return 200, {"success": True, "message": "recorded by the sglang double"}


_TENSOR_PAYLOAD = None


def _tensor_payload():
    """The double's restricted decoder (tests/doubles/tensor_payload.py), loaded by path: this file runs as a script."""
    global _TENSOR_PAYLOAD
    if _TENSOR_PAYLOAD is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("sglang_double_tensor_payload",
                                                      Path(__file__).with_name("tensor_payload.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _TENSOR_PAYLOAD = module
    return _TENSOR_PAYLOAD


def _update_weights_from_tensor(state: DoubleState, body: dict) -> tuple[int, object]:
    """Open every TP rank's entry as sglang does (restricted unpickler; a GPU UUID maps to the local index)
    and record what arrived: names, shapes, dtypes, devices and a sum of |values| per entry."""
    refused = _session_refusal(state, "/update_weights_from_tensor")
    if refused is not None:
        return refused
    if state.memory_released:
        return 400, {"success": False, "message": "memory released: resume it before updating weights"}
    if body.get("load_format") is not None:
        return 400, {"success": False, "message": f"the double decodes plain named tensors only, not load_format "
                                                  f"{body['load_format']!r}"}
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or len(entries) != state.args.tp_size:
        count = len(entries) if isinstance(entries, list) else type(entries).__name__
        return 400, {"success": False, "message": f"serialized_named_tensors needs one entry per TP rank "
                                                  f"({state.args.tp_size}), got {count}"}
    decoder = _tensor_payload()
    summaries = []
    for tp_rank, entry in enumerate(entries):
        try:
            named = decoder.decode_named_tensors(entry)
        except decoder.RefusedPayload as exc:
            return 400, {"success": False, "message": f"TP rank {tp_rank}'s entry refused: {exc}"}
        summaries.append(decoder.summarize(named))
        del named  # the sender's memory is released as sglang releases it, once copied
    first = summaries[0]
    for tp_rank, summary in enumerate(summaries[1:], start=1):
        if (summary["names"], summary["shapes"], summary["dtypes"]) != (first["names"], first["shapes"], first["dtypes"]):
            return 400, {"success": False, "message": f"TP rank {tp_rank}'s tensors differ from TP rank 0's"}
    if body.get("weight_version") is not None and not state.args.pin_weight_version:
        state.weight_version = str(body["weight_version"])
    received = {**first, "entries": len(summaries), "abs_sums": [s["abs_sum"] for s in summaries]}
    return 200, {"success": True, "message": "Succeeded to update model weights.", "received": received}


def _release_memory(state: DoubleState, body: dict) -> tuple[int, object, dict]:
    """Releases memory only with ``--enable-memory-saver``: without it sglang's memory saver adapter is a no-op
    (python/sglang/srt/utils/torch_memory_saver_adapter.py, 0.5.19 and 0.5.23). The answer is sglang's (null);
    whether anything was released goes to the call log."""
    state.memory_released = bool(state.args.enable_memory_saver)
    return 200, None, {"memory_released": state.memory_released}


def _resume_memory(state: DoubleState, body: dict) -> tuple[int, object, dict]:
    state.memory_released = False
    return 200, None, {"memory_released": False}


def _pause_generation(state: DoubleState, body: dict) -> tuple[int, object]:
    state.generation_paused = True
    return 200, {"success": True}


def _continue_generation(state: DoubleState, body: dict) -> tuple[int, object]:
    state.generation_paused = False
    return 200, {"success": True}


def _generate(state: DoubleState, body: dict) -> tuple[int, object]:
    tokens, sequences = _batch(body)
    _forward(state, "/generate", tokens=tokens, sequences=sequences)
    return 200, {
        "text": "",
        "output_ids": [],
        "meta_info": {"finish_reason": {"type": "length"}, "weight_version": state.weight_version},
    }


def _double_health(state: DoubleState, body: dict) -> tuple[int, object]:
    state.healthy = bool(body.get("healthy", True))
    return 200, {"healthy": state.healthy}


ROUTES = {
    "/health": _health,
    "/health_generate": _health_generate,
    "/flush_cache": _flush_cache,
    "/model_info": _model_info,
    "/get_model_info": _model_info,
    "/begin_weight_update": _begin_weight_update,
    "/end_weight_update": _end_weight_update,
    "/update_weights_from_disk": _update_weights_from_disk,
    "/update_weight_version": _update_weight_version,
    "/update_weights_from_tensor": _update_weights_from_tensor,
    "/init_weights_update_group": _init_weights_update_group,
    "/destroy_weights_update_group": _destroy_weights_update_group,
    "/update_weights_from_distributed": _update_weights_from_distributed,
    "/release_memory_occupation": _release_memory,
    "/resume_memory_occupation": _resume_memory,
    "/pause_generation": _pause_generation,
    "/continue_generation": _continue_generation,
    "/generate": _generate,
    "/_double/health": _double_health,
}


def routes_for(version: str) -> dict:
    """The routes of ``version``: before 0.5.21 there are no weight-update session routes (404)."""
    if version_tuple(version) >= SESSIONS_SINCE:
        return dict(ROUTES)
    return {path: handler for path, handler in ROUTES.items() if path not in ("/begin_weight_update",
                                                                             "/end_weight_update")}


def main(argv: list[str] | None = None) -> int:
    try:
        args, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:  # sglang's own parser refused the argv: sglang's launcher exits 2 with argparse's line
        print(f"sglang_double: {exc}", file=sys.stderr, flush=True)
        return 2
    problem = start_problem(args)
    if problem is not None:
        print(f"sglang_double: {problem}", file=sys.stderr, flush=True)
        return 1
    state = DoubleState(args, unknown)
    if args.double_gpu_memory_gib:
        state.memory = sglang_memory().plan_memory(args, args.double_gpu_memory_gib)
    if args.startup_delay:
        time.sleep(args.startup_delay)
    if state.memory is not None and state.memory.refusal:
        _record_start(state, argv)  # what it decided, then the end of sglang's start-up
        sglang_memory().die_like_sglang(sglang_memory().refusal_exception(state.memory), serving=False)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    _record_start(state, argv)

    def _stop(signum: int, frame: object) -> None:
        state.write_json("stop", {"pid": os.getpid(), "signal": signum, "time": time.time()})
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server.serve_forever(poll_interval=0.1)
    server.server_close()
    return 0


def _record_start(state: DoubleState, argv: list[str] | None) -> None:
    """``start-<port>.json`` (and a line of ``starts-<port>.jsonl``): who started, how, and the memory budget."""
    args = state.args
    start = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "argv": sys.argv if argv is None else argv,
        "sglang_version": args.sglang_version,
        "sglang_parser": args.sglang_parser,
        "known": vars(args),
        "unknown": state.unknown,
        "memory": None if state.memory is None else state.memory.record(),
        "time": time.time(),
    }
    state.write_json("start", start)
    starts = state.record_file("starts", "jsonl")
    if starts is not None:
        with open(starts, "a", encoding="utf-8") as out:
            out.write(json.dumps(start) + "\n")


if __name__ == "__main__":
    sys.exit(main())
