"""The slime / miles flag tables (read from upstream's arguments.py) hold every flag forge-replay injects."""

from __future__ import annotations

import re

import pytest

from forge_replay.frameworks.flags import (
    BACKEND_INJECTED, BACKENDS, INJECTED_UNLESS_GIVEN, OWN_FLAGS, REFUSED_FLAGS, flag_table,
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_names_its_upstream_commit(backend: str) -> None:
    table = flag_table(backend)
    assert table.backend == backend
    assert re.fullmatch(r"[0-9a-f]{40}", table.commit), table.commit
    assert table.file == f"{backend}/utils/arguments.py"
    assert table.repository in ("THUDM/slime", "radixark/miles")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_injected_flag_is_declared_upstream(backend: str) -> None:
    table = flag_table(backend)
    missing = [flag for flag in (*BACKEND_INJECTED[backend], *INJECTED_UNLESS_GIVEN) if not table.has(flag)]
    # miles has no --load-forge-rollout-data: our rollout function's add_arguments adds it (issue 14).
    expected = set(OWN_FLAGS) if backend == "miles" else set()
    assert set(missing) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_refused_flag_is_declared_upstream(backend: str) -> None:
    table = flag_table(backend)
    assert [flag for flag in REFUSED_FLAGS[backend] if not table.has(flag)] == []


def test_tables_differ_where_upstream_does() -> None:
    slime, miles = flag_table("slime"), flag_table("miles")
    assert slime.has("--load-forge-rollout-data") and not miles.has("--load-forge-rollout-data")
    assert miles.options["--ft-components"]["choices"] == ["rollout", "train"] and not slime.has("--ft-components")
    assert miles.has("--fully-async") and not slime.has("--fully-async")
    for table in (slime, miles):
        assert table.options["--colocate"]["takes_value"] is False
        assert table.options["--num-rollout"]["type"] == "int"


def test_unknown_backend_has_no_table() -> None:
    with pytest.raises(ValueError, match="builtin"):
        flag_table("builtin")
