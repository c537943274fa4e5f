"""The claims a job names, and why one cannot be mounted (controller/claims.py)."""

from __future__ import annotations

from forge_replay.api import parse_job
from forge_replay.controller.claims import claim_problems, named_claims
from forge_replay.controller.status import status_for_claims


def _job(**spec):
    doc = {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "u-1", "generation": 1},
           "spec": {"replay": {"mode": "debug", "dumps": {"claimName": "dumps", "path": "r_{rollout_id}.pt"},
                               "numRollouts": 2, "verify": False},
                    "model": {"config": {"hidden_size": 8}}, "trainer": {"nodes": 1, "gpusPerNode": 1}} | spec}
    return parse_job(doc)


def _pvc(*modes: str, bound: tuple[str, ...] = ()) -> dict:
    pvc = {"metadata": {"name": "x"}, "spec": {"accessModes": list(modes)}}
    if bound:
        pvc["status"] = {"phase": "Bound", "accessModes": list(bound)}
    return pvc


def test_named_claims_are_the_dumps_model_and_results_claims_once_each() -> None:
    job = _job(model={"claimName": "shared", "path": "ckpt"}, results={"claimName": "shared"})
    claims = {c.name: c for c in named_claims(job)}
    assert set(claims) == {"dumps", "shared"}
    assert not claims["dumps"].writes and claims["dumps"].fields == ("spec.replay.dumps.claimName",)
    # one claim for the checkpoint and the results: written to, so it needs ReadWriteMany
    assert claims["shared"].writes and claims["shared"].fields == ("spec.model.claimName", "spec.results.claimName")
    assert [c.name for c in named_claims(_job())] == ["dumps"]
    with_baseline = _job(expect={"baseline": {"claimName": "runs", "path": "v1/report.json"}})
    assert [(c.name, c.fields, c.writes) for c in named_claims(with_baseline)][1:] == [
        ("runs", ("spec.expect.baseline.claimName",), False)]


def test_missing_and_single_node_claims_are_problems_naming_claim_and_field() -> None:
    dumps, results = named_claims(_job(results={"claimName": "out"}))
    assert claim_problems("ml", [(dumps, _pvc("ReadOnlyMany")), (results, _pvc("ReadWriteMany"))]) == []
    missing, = claim_problems("ml", [(dumps, None), (results, _pvc("ReadWriteMany"))])
    assert missing.reason == "ClaimNotFound"
    assert "PersistentVolumeClaim ml/dumps (spec.replay.dumps.claimName) does not exist" in missing.message
    rwo, = claim_problems("ml", [(dumps, _pvc("ReadWriteMany")), (results, _pvc("ReadWriteOnce"))])
    assert rwo.reason == "ClaimAccessMode" and "ml/out (spec.results.claimName)" in rwo.message
    assert "needs ReadWriteMany" in rwo.message
    # results are written: ReadOnlyMany is not enough; a bound claim's own modes win over what it asked for
    assert claim_problems("ml", [(results, _pvc("ReadOnlyMany"))])[0].reason == "ClaimAccessMode"
    assert claim_problems("ml", [(dumps, _pvc("ReadWriteOnce", bound=("ReadWriteMany",)))]) == []


def test_claim_status_is_pending_and_stalled_with_every_problem() -> None:
    job = _job(results={"claimName": "out"})
    dumps, results = named_claims(job)
    problems = claim_problems("ml", [(dumps, None), (results, _pvc("ReadWriteOncePod"))])
    status = status_for_claims(job, problems)
    assert status["phase"] == "Pending"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Stalled"]["status"] == "True" and conditions["Stalled"]["reason"] == "ClaimNotFound"
    assert conditions["ClusterReady"]["reason"] == "ClaimNotFound"
    assert "ml/dumps" in status["message"] and "ml/out" in status["message"]
