"""Random specs, well-formed and malformed, only ever produce a validation result."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge_replay.api import NotAForgeReplayJob, SpecInvalid, parse_job
from tests.unit.spec_factory import debug_job, forge_job

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
    st.text(max_size=60), st.sampled_from(["forge", "debug", "train", "rollout", "{rollout_id}", "..", "/x"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)

FIELD_PATHS = [
    ("spec", "replay", "mode"), ("spec", "replay", "numRollouts"), ("spec", "replay", "evalInterval"),
    ("spec", "replay", "dumps", "path"), ("spec", "replay", "dumps", "claimName"), ("spec", "rollout"),
    ("spec", "rollout", "numGpus"), ("spec", "rollout", "numGpusPerEngine"), ("spec", "rollout", "colocate"),
    ("spec", "rollout", "engineArgs"), ("spec", "faultTolerance"), ("spec", "faultTolerance", "components"),
    ("spec", "faultTolerance", "enabled"), ("spec", "trainer"), ("spec", "trainer", "nodes"),
    ("spec", "model"), ("spec", "model", "path"), ("spec", "scheduling", "tolerations"), ("metadata",),
    ("metadata", "name"), ("spec",), ("spec", "unknownField"), ("spec", "results", "claimName"),
]


def mutate(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value
    return doc


def outcome(doc):
    """'ok' or 'invalid'; any other exception fails the property."""
    try:
        parse_job(doc)
        return "ok"
    except SpecInvalid as exc:
        assert exc.problems, "SpecInvalid without problems"
        for problem in exc.problems:
            assert problem.message, problem
        return "invalid"
    except NotAForgeReplayJob:
        return "other-kind"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([forge_job(), debug_job()]),
       edits=st.lists(st.tuples(st.sampled_from(FIELD_PATHS), values), max_size=4))
def test_mutated_specs_only_give_a_validation_result(base, edits):
    doc = base
    for path, value in edits:
        doc = mutate(doc, path, value)
    assert outcome(doc) in ("ok", "invalid")


@settings(max_examples=200, deadline=None)
@given(values)
def test_arbitrary_documents_never_crash(doc):
    assert outcome(doc) in ("ok", "invalid", "other-kind")


@settings(max_examples=100, deadline=None)
@given(num_gpus=st.integers(1, 64), per_engine=st.integers(1, 16))
def test_divisibility_rule_matches_arithmetic(num_gpus, per_engine):
    doc = forge_job(spec__rollout={"numGpus": num_gpus, "numGpusPerEngine": per_engine},
                    spec__trainer={"nodes": 1, "gpusPerNode": 8})
    assert (outcome(doc) == "ok") == (num_gpus % per_engine == 0)


INT_FIELDS = [
    ("spec", "replay", "numRollouts"), ("spec", "replay", "startRolloutId"), ("spec", "replay", "evalInterval"),
    ("spec", "trainer", "nodes"), ("spec", "trainer", "gpusPerNode"), ("spec", "trainer", "microBatchTokens"),
    ("spec", "trainer", "nSamplesPerPrompt"), ("spec", "trainer", "seed"), ("spec", "rollout", "numGpus"),
    ("spec", "rollout", "serverConcurrency"), ("spec", "ttlSecondsAfterFinished"),
]
not_integers = st.one_of(st.booleans(), st.integers(0, 10**6).map(float), st.integers(0, 10**6).map(str))


@settings(max_examples=150, deadline=None)
@given(path=st.sampled_from(INT_FIELDS), value=not_integers)
def test_integer_fields_take_integers_only(path, value):
    """As the API server reads them: true, 4.0 and '4' are not integers."""
    try:
        parse_job(mutate(forge_job(), path, value))
    except SpecInvalid as exc:
        assert any(p.path == ".".join(path) and "valid integer" in p.message for p in exc.problems), exc.problems
    else:
        raise AssertionError(f"{'.'.join(path)}: {value!r} accepted")


@settings(max_examples=150, deadline=None)
@given(path=st.sampled_from(INT_FIELDS), value=st.integers(-2**70, 2**70))
def test_integer_fields_stay_within_int32(path, value):
    """Whatever an integer field accepts fits the int32 Kubernetes stores such counts in."""
    try:
        job = parse_job(mutate(forge_job(), path, value))
    except SpecInvalid:
        return
    node = job.model_dump(by_alias=True)
    for part in path:
        node = node[part]
    assert node == value and -2**31 <= value < 2**31


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab:&*[]{}-, \n'\"!<#|>?1.e")), max_size=80))
def test_any_yaml_text_gives_documents_or_a_yaml_error(text):
    import yaml

    from forge_replay.api.parse import DocumentInvalid, load_yaml_documents

    try:
        load_yaml_documents(text)
    except (yaml.YAMLError, DocumentInvalid):
        pass
