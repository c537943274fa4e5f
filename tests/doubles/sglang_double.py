"""TEST DOUBLE for an sglang HTTP server (sglang needs CUDA; the CPU machines here cannot run it).

This is a real HTTP server process that speaks the part of sglang's HTTP API forge-replay calls,
and records every request, so tests can check what the engines were sent. It is launched exactly
as ``python -m sglang.launch_server`` would be (``forge-replay run --engine-command "python
tests/doubles/sglang_double.py --record-dir DIR"``): it takes sglang's arguments (``--host``,
``--port``, ``--model-path``, ``--load-format``, ...) and accepts and records any unknown ones.

Records (JSON, under ``--record-dir`` or ``$SGLANG_DOUBLE_RECORD_DIR``, one set per port):
- ``start-<port>.json``: pid, pgid, argv, the parsed known args and the unknown ones (the latest
  start; ``starts-<port>.jsonl`` keeps every start on that port, e.g. after a recovery);
- ``calls-<port>.jsonl``: one line per request: time, method, path, JSON body;
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
middle of the K-th distributed bucket), ``--die-during-disk-push K``, ``--die-on-version-check``, ``--refuse-group-join`` and ``--refuse-bucket K`` (receive it,
then answer 400 ``success: false``, as sglang does when its load fails).
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


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Parse the sglang launch_server arguments the double cares about; return the rest as unknown."""
    parser = argparse.ArgumentParser(prog="sglang_double", add_help=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--base-gpu-id", type=int, default=0)
    parser.add_argument("--skip-server-warmup", action="store_true")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--record-dir", default=os.environ.get("SGLANG_DOUBLE_RECORD_DIR"))
    parser.add_argument(
        "--startup-delay", type=float, default=0.0, help="seconds to wait before listening (double only)"
    )
    parser.add_argument(
        "--missing-endpoint", action="append", default=[],
        help="answer 404 on this path, like a minimal stand-in server (double only; repeatable)",
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
        help="the first engine of the record dir to get /get_weight_version exits (code 17) instead of answering: "
             "it took the weights, then died (double only)",
    )
    parser.add_argument(
        "--refuse-group-join", action="store_true",
        help="the first engine of the record dir to get /init_weights_update_group answers 400 {success: false} "
             "without joining, as sglang does when its process group cannot be made; the others join (double only)",
    )
    parser.add_argument(
        "--refuse-bucket", type=int, default=0, metavar="K",
        help="receive the K-th /update_weights_from_distributed bucket, then answer 400 {success: false} as "
             "sglang does when loading it fails (double only)",
    )
    return parser.parse_known_args(argv)


class DoubleState:
    """What the double remembers: weight version, memory state, health switch, and the call log."""

    def __init__(self, args: argparse.Namespace, unknown: list[str]):
        self.args = args
        self.unknown = unknown
        self.weight_version = args.weight_version
        self.model_path = args.model_path
        self.memory_released = False
        self.generation_paused = False
        self.healthy = True
        self.lock = threading.Lock()
        self.weight_groups: dict[str, object] = {}
        self.distributed_requests = 0
        self.disk_requests = 0
        self.weight_group_devices: dict[str, str] = {}
        self.record_dir = Path(args.record_dir) if args.record_dir else None
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)

    def record_file(self, kind: str, suffix: str) -> Path | None:
        if self.record_dir is None:
            return None
        return self.record_dir / f"{kind}-{self.args.port}.{suffix}"

    def record_call(self, method: str, path: str, body: object) -> None:
        target = self.record_file("calls", "jsonl")
        if target is None:
            return
        line = json.dumps({"time": time.time(), "method": method, "path": path, "body": body})
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
            handler = None if path in state.args.missing_endpoint else ROUTES.get(path)
            if handler is None:
                state.record_call(method, path, body)
                self._send(404, {"error": f"the sglang double does not implement {method} {path}"})
                return
            try:
                status, payload = handler(state, body if isinstance(body, dict) else {})
            except Exception as exc:  # noqa: BLE001 - answer like a server would, and say what failed
                status, payload = 500, {"success": False, "message": f"{type(exc).__name__}: {exc}"}
            received = payload.get("received") if isinstance(payload, dict) else None
            state.record_call(method, path, body if received is None else {**body, "received": received})
            self._send(status, payload)

    return Handler


def _health(state: DoubleState, body: dict) -> tuple[int, object]:
    return (200, "") if state.healthy else (503, "unhealthy (set by the test double's control endpoint)")


def _health_generate(state: DoubleState, body: dict) -> tuple[int, object]:
    if state.memory_released:
        return 503, "memory released: resume it before generating"
    return _health(state, body)


def _flush_cache(state: DoubleState, body: dict) -> tuple[int, object]:
    return 200, "Cache flushed."


def _get_weight_version(state: DoubleState, body: dict) -> tuple[int, object]:
    if state.args.die_on_version_check and _first_death(state):
        os._exit(17)
    return 200, {"weight_version": state.weight_version}


def _update_weights_from_disk(state: DoubleState, body: dict) -> tuple[int, object]:
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


def _init_weights_update_group(state: DoubleState, body: dict) -> tuple[int, object]:
    """Join the trainer's weight-sync group the way sglang's engines do (a TCP store under the group's name)."""
    import datetime

    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

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
    timeout = datetime.timedelta(seconds=60)
    store, rank, world_size = next(rendezvous(f"tcp://{body['master_address']}:{body['master_port']}", rank,
                                              world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(name, store),
                                         group_name=name, timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    state.weight_groups[name] = group
    state.weight_group_devices[name] = device
    return 200, {"success": True, "message": f"joined {name} as rank {rank} of {world_size}"}


def _destroy_weights_update_group(state: DoubleState, body: dict) -> tuple[int, object]:
    import torch.distributed as dist

    group = state.weight_groups.pop(body.get("group_name"), None)
    if group is None:
        return 400, {"success": False, "message": f"no weight group {body.get('group_name')!r}"}
    dist.destroy_process_group(group)
    return 200, {"success": True, "message": ""}


def _update_weights_from_distributed(state: DoubleState, body: dict) -> tuple[int, object]:
    """Receive one bucket by broadcast from rank 0 of the named group, in the announced order."""
    import torch
    import torch.distributed as dist

    group = state.weight_groups.get(body.get("group_name"))
    if group is None:
        return 400, {"success": False, "message": f"no weight group {body.get('group_name')!r}: init it first"}
    with state.lock:
        state.distributed_requests += 1
        number = state.distributed_requests
    die = number == state.args.die_during_broadcast and _first_death(state)
    abs_sum = 0.0
    for dtype, shape in zip(body["dtypes"], body["shapes"], strict=True):
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


def _release_memory(state: DoubleState, body: dict) -> tuple[int, object]:
    state.memory_released = True
    return 200, {"success": True}


def _resume_memory(state: DoubleState, body: dict) -> tuple[int, object]:
    state.memory_released = False
    return 200, {"success": True}


def _pause_generation(state: DoubleState, body: dict) -> tuple[int, object]:
    state.generation_paused = True
    return 200, {"success": True}


def _continue_generation(state: DoubleState, body: dict) -> tuple[int, object]:
    state.generation_paused = False
    return 200, {"success": True}


def _generate(state: DoubleState, body: dict) -> tuple[int, object]:
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
    "/get_weight_version": _get_weight_version,
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


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    state = DoubleState(args, unknown)
    if args.startup_delay:
        time.sleep(args.startup_delay)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    start = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "argv": sys.argv if argv is None else argv,
        "known": vars(args),
        "unknown": unknown,
        "time": time.time(),
    }
    state.write_json("start", start)
    starts = state.record_file("starts", "jsonl")
    if starts is not None:
        with open(starts, "a", encoding="utf-8") as out:
            out.write(json.dumps(start) + "\n")

    def _stop(signum: int, frame: object) -> None:
        state.write_json("stop", {"pid": os.getpid(), "signal": signum, "time": time.time()})
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server.serve_forever(poll_interval=0.1)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
