"""The Argo CD health check for ForgeReplayJob, run with a real Lua 5.1 interpreter (lupa).

Argo CD evaluates health checks with gopher-lua (Lua 5.1) with only the package, base and table
libraries (plus a safe os), the object as the global `obj`, and the script's return value as the
health. The sandbox below removes every other library so a script that would fail in Argo CD fails here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

lupa_lua51 = pytest.importorskip("lupa.lua51", reason="lupa (dev extra) runs the Argo CD health Lua")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHECK_DIR = REPO / "gitops" / "argocd" / "forgereplay.io" / "ForgeReplayJob"
HEALTH_LUA = CHECK_DIR / "health.lua"
ARGOCD_CM_PATCH = REPO / "gitops" / "argocd" / "argocd-cm-patch.yaml"
ARGOCD_HEALTH_KEY = "resource.customizations.health.forgereplay.io_ForgeReplayJob"
VALID_HEALTH = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
# Globals Argo CD's gopher-lua state does not have (it opens package, base, table and a safe os).
NOT_IN_ARGOCD = ("string", "math", "io", "os", "debug", "coroutine", "dofile", "loadfile", "load", "loadstring")


def run_health(obj: dict, script: str | None = None) -> dict:
    """Evaluate the health Lua on one object the way Argo CD does; returns {"status", "message"}."""
    lua = lupa_lua51.LuaRuntime(unpack_returned_tuples=True)
    lua_globals = lua.globals()
    for name in NOT_IN_ARGOCD:
        lua_globals[name] = None
    lua_globals.obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script if script is not None else HEALTH_LUA.read_text())
    assert result is not None, "the health check must return a table"
    return {"status": result["status"], "message": result["message"]}


def argocd_cases() -> list[tuple[str, dict, dict]]:
    spec = yaml.safe_load((CHECK_DIR / "health_test.yaml").read_text())
    return [
        (case["inputPath"], yaml.safe_load((CHECK_DIR / case["inputPath"]).read_text()), case["healthStatus"])
        for case in spec["tests"]
    ]


@pytest.mark.parametrize(("input_path", "obj", "expected"), argocd_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_argocd_health_test_cases(input_path: str, obj: dict, expected: dict) -> None:
    assert run_health(obj) == expected, input_path


def test_every_testdata_file_is_a_case() -> None:
    used = {path for path, _, _ in argocd_cases()}
    present = {f"testdata/{p.name}" for p in (CHECK_DIR / "testdata").glob("*.yaml")}
    assert present == used, f"testdata files without a case in health_test.yaml: {sorted(present - used)}"


def test_cases_cover_every_health_the_check_can_return() -> None:
    assert {expected["status"] for _, _, expected in argocd_cases()} == {
        "Healthy", "Progressing", "Degraded", "Suspended", "Unknown"
    }


def test_sandbox_rejects_string_library() -> None:
    # Guards the sandbox itself: a script calling string.* must fail as it does in Argo CD.
    with pytest.raises(lupa_lua51.LuaError):
        run_health({}, 'return {status = string.upper("healthy"), message = ""}')


def test_argocd_cm_patch_embeds_the_same_lua() -> None:
    data = yaml.safe_load(ARGOCD_CM_PATCH.read_text())["data"]
    assert data[ARGOCD_HEALTH_KEY] == HEALTH_LUA.read_text(), (
        f"{ARGOCD_CM_PATCH.relative_to(REPO)} embeds a different health check than "
        f"{HEALTH_LUA.relative_to(REPO)}: re-embed the .lua file (indented 4 spaces) under {ARGOCD_HEALTH_KEY}"
    )


PHASES = ["Pending", "Verifying", "Launching", "Running", "Succeeded", "Failed", "Suspended"]
condition_st = st.fixed_dictionaries({
    "type": st.sampled_from(["Ready", "Reconciling", "Stalled", "SpecValid", "DumpsVerified", "ClusterReady"]),
    "status": st.sampled_from(["True", "False", "Unknown"]),
    "reason": st.text(max_size=5),
    "message": st.text(max_size=20),
})
status_st = st.fixed_dictionaries(
    {"phase": st.sampled_from(PHASES), "observedGeneration": st.integers(1, 5)},
    optional={
        "conditions": st.lists(condition_st, max_size=6),
        "message": st.text(max_size=20),
        "rollouts": st.fixed_dictionaries({"completed": st.integers(0, 9), "total": st.integers(1, 9)}),
        "outcome": st.sampled_from(["fits", "overBudget", "outOfMemory", "failed"]),
    },
)


@settings(max_examples=150, deadline=None)
@given(status=status_st, generation=st.integers(1, 5))
def test_any_status_gets_a_valid_health_and_stale_ones_progress(status: dict, generation: int) -> None:
    base = yaml.safe_load((CHECK_DIR / "testdata" / "no-status.yaml").read_text())
    obj = copy.deepcopy(base)
    obj["metadata"]["generation"] = generation
    obj["status"] = status
    health = run_health(obj)
    assert health["status"] in VALID_HEALTH
    assert isinstance(health["message"], str) and health["message"]
    if status["observedGeneration"] < generation:
        assert health["status"] == "Progressing", health
    elif (first := {c["type"]: c["status"] for c in reversed(status.get("conditions") or [])}) and (
            first.get("Stalled") == "True" or first.get("SpecValid") == "False"):  # the first of each type counts
        assert health["status"] == "Degraded", health  # as kstatus: Stalled=True is Failed, whatever the phase
    elif status["phase"] == "Succeeded":
        assert health["status"] == "Healthy", health
    elif status["phase"] == "Failed":
        assert health["status"] == "Degraded", health
