"""Every request forge-replay sends to an engine exists in sglang's own HTTP app, with that method, and every body
constructs sglang's own request class (``sglang.srt.entrypoints.http_server.app``,
``sglang.srt.managers.io_struct``, the pinned version).

The requests are not listed by hand: they are the ones recorded forge runs actually sent (the double's
``calls-<port>.jsonl``: fleet, weight sync and health monitor), plus what colocated engines are sent (memory calls,
the tensor update), which needs GPUs to run and is taken from the client functions themselves. A scan of the
runtime's code for route paths catches the calls no CPU run makes (failure paths, fallbacks)."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path
from urllib.parse import urlsplit

import forge_replay.runtime
import pytest
import torch
from forge_replay.runtime.weights.calls import release_memory, resume_memory
from forge_replay.runtime.weights.ipc import serialize_named_tensors, update_request_body

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DOUBLE_NOTES = ("double", "received")
"""Keys the double adds to a recorded body (its own notes, not part of the request)."""


def flat_routes(routes, prefix: str = ""):
    """(full path, route) of every endpoint, inside included routers too (FastAPI keeps those as one entry)."""
    for route in routes:
        if hasattr(route, "original_router"):  # fastapi.routing._IncludedRouter
            yield from flat_routes(route.original_router.routes, prefix + route.include_context.prefix)
        elif hasattr(route, "endpoint"):
            yield prefix + route.path, route


def sglang_routes() -> dict[str, tuple[set[str], type | None]]:
    """path -> (methods, request class of the body or None) of sglang's FastAPI app."""
    from sglang.srt.entrypoints.http_server import app

    routes: dict[str, tuple[set[str], type | None]] = {}
    for path, route in flat_routes(app.routes):
        methods = set(getattr(route, "methods", None) or ())
        body_class = None
        for parameter, hint in typing.get_type_hints(route.endpoint, include_extras=True).items():
            base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
            if getattr(base, "__module__", "") == "sglang.srt.managers.io_struct":
                body_class = base
        known = routes.get(path, (set(), None))
        routes[path] = (known[0] | methods, known[1] or body_class)
    return routes


def memory_calls() -> list[dict]:
    """What release_memory and resume_memory send (colocated engines only: GPU runs)."""
    sent = []

    def record(url, path, *, method="GET", body=None, timeout_s=0.0):
        sent.append({"method": method, "path": path, "body": body, "status": 200})
        return {"success": True}

    release_memory("http://engine", call=record)
    resume_memory("http://engine", call=record)
    return sent


def sent_requests(recorded_runs) -> list[tuple[str, str, dict | None, str]]:
    """(method, path, body, where) of every request the recorded runs sent to an engine, and the memory calls."""
    out = []
    for name, run in recorded_runs.items():
        assert run.engines, f"run {name} recorded no engine: {run.result.stderr[-2000:]}"
        for engine in run.engines.values():
            for call in engine["calls"]:
                body = call["body"]
                if isinstance(body, dict):
                    body = {k: v for k, v in body.items() if k not in DOUBLE_NOTES}
                out.append((call["method"], urlsplit(call["path"]).path, body, f"run {name}"))
    out += [(c["method"], c["path"], c["body"], "release_memory/resume_memory") for c in memory_calls()]
    payload = serialize_named_tensors([("model.embed_tokens.weight", torch.ones(4, 2))])  # CPU: shared memory
    tensor_body = update_request_body([payload], flush_cache=True, weight_version="1")
    out.append(("POST", "/update_weights_from_tensor", tensor_body, "weights.ipc.update_request_body"))
    return out


ROUTER_CLIENT = "engines/router.py"
"""Talks to sglang_router's own API (``/workers``), not to an engine."""


def route_literals() -> dict[str, str]:
    """Every engine route path the runtime's code sends to (a call's argument, or a module constant) -> its file."""
    root = Path(forge_replay.runtime.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == ROUTER_CLIENT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        places = [arg for node in ast.walk(tree) if isinstance(node, ast.Call) for arg in node.args]
        places += [node.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value]
        in_f_strings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for place in places:
            for node in ast.walk(place):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_f_strings
                        and re.fullmatch(r"/[a-z_]+", node.value)):
                    found[node.value] = path.relative_to(root).as_posix()
    return found


def test_every_route_path_in_the_runtime_code_exists_in_sglangs_app():
    routes = sglang_routes()
    literals = route_literals()
    assert {"/update_weights_from_tensor", "/destroy_weights_update_group", "/health"} <= set(literals)
    missing = {path: where for path, where in literals.items() if path not in routes}
    assert not missing, f"paths sglang's app does not serve: {missing}"


def test_every_route_and_method_we_call_exists_in_sglangs_app(recorded_runs):
    routes = sglang_routes()
    called = {(method, path): where for method, path, _, where in sent_requests(recorded_runs)}
    # the runs must have covered the weight sync of both paths, the version read-back and the health probe
    paths = {path for _, path in called}
    assert {"/update_weights_from_disk", "/init_weights_update_group", "/update_weights_from_distributed",
            "/begin_weight_update", "/end_weight_update", "/model_info", "/health_generate"} <= paths
    missing = [f"{method} {path} ({where})" for (method, path), where in sorted(called.items())
               if method not in routes.get(path, (set(), None))[0]]
    assert not missing, f"sglang's app has no such route/method: {missing}"


def test_every_body_we_send_constructs_sglangs_request_class(recorded_runs):
    from pydantic import TypeAdapter

    routes = sglang_routes()
    checked = set()
    for method, path, body, where in sent_requests(recorded_runs):
        body_class = routes.get(path, (set(), None))[1]
        if body_class is None:
            assert not body, f"{method} {path} ({where}) sends a body {body} that sglang's handler never reads"
            continue
        request = body_class(**(body or {}))  # a field sglang lacks is a TypeError; a missing one too
        TypeAdapter(body_class).validate_python(body or {})  # what FastAPI does with the JSON: types checked
        assert isinstance(request, body_class)
        checked.add(body_class.__name__)
    assert {"UpdateWeightFromDiskReqInput", "InitWeightsUpdateGroupReqInput",
            "UpdateWeightsFromDistributedReqInput", "ReleaseMemoryOccupationReqInput",
            "UpdateWeightsFromTensorReqInput", "BeginWeightUpdateReqInput"} <= checked, checked
