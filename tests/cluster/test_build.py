"""The generic builder: declarations, cache keys, the missing-Go message (no Go build runs here)."""

from __future__ import annotations

import re

import pytest

from tests.cluster import build


def write_module(root, name: str, binaries: str = "", files: str | None = None, go_sum: str = "") -> object:
    directory = root / name
    directory.mkdir()
    (directory / "go.mod").write_text(f"module example.test/{name}\n\ngo 1.26.0\n")
    (directory / "go.sum").write_text(go_sum)
    (directory / "binaries.txt").write_text(binaries)
    if files is not None:
        (directory / "files.txt").write_text(files)
    return directory


def test_binaries_txt_lines_become_specs_with_ldflags(tmp_path):
    module = write_module(tmp_path, "tools", "# comment\n\nhelm helm.sh/helm/v3/cmd/helm -X a.b=c -X d.e=f  # trailing\n"
                                             "kstatus sigs.k8s.io/cli-utils/cmd/status\n")
    specs = build.parse_binaries(module)
    assert [(s.name, s.package, s.extra_ldflags, s.module) for s in specs] == [
        ("helm", "helm.sh/helm/v3/cmd/helm", "-X a.b=c -X d.e=f", "tools"),
        ("kstatus", "sigs.k8s.io/cli-utils/cmd/status", "", "tools"),
    ]


def test_malformed_declarations_name_file_and_line(tmp_path):
    module = write_module(tmp_path, "broken", "ok example.test/ok\nlonely\n", files="only-two fields\n")
    with pytest.raises(build.BuildError, match=r"binaries\.txt:2: expected"):
        build.parse_binaries(module)
    with pytest.raises(build.BuildError, match=r"files\.txt:1: expected"):
        build.parse_files(module)


def test_cache_key_changes_only_when_pins_or_sources_change(tmp_path):
    module = write_module(tmp_path, "m", "x example.test/x\n", go_sum="a v1 h1:xyz\n")
    key = build.module_key(module)
    (module / "NOTES.md").write_text("not a pin")
    (module / ".editor-swap").write_text("not a source")
    assert build.module_key(module) == key
    (module / "go.sum").write_text("a v2 h1:abc\n")
    bumped = build.module_key(module)
    assert bumped != key
    (module / "binaries.txt").write_text("x example.test/x -X v=2\n")
    stamped = build.module_key(module)
    assert stamped not in (key, bumped)
    (module / "main.go").write_text("package main\n\nfunc main() {}\n")  # a module's own tool source
    with_source = build.module_key(module)
    assert with_source != stamped
    (module / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert build.module_key(module) != with_source


def test_every_committed_module_declares_something_buildable():
    modules = build.module_dirs()
    assert {m.name for m in modules} >= {"kubernetes", "etcd", "kuberay", "kwok"}
    names = build.declared_names()
    for wanted in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok",
                   "kuberay-operator", "kuberay-crds", "kwok-stages"):
        assert wanted in names
    for module in modules:
        assert (module / "go.sum").exists(), f"{module} has no committed go.sum"


def test_kubernetes_version_stamp_matches_the_pin():
    module = build.GO_MODULES_DIR / "kubernetes"
    pinned = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", (module / "go.mod").read_text(),
                       re.MULTILINE).group(1)
    for spec in build.parse_binaries(module):
        assert f"version.gitVersion={pinned}" in spec.extra_ldflags, spec.name


def test_missing_go_gives_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_REPLAY_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no go here
    with pytest.raises(build.GoToolchainMissing, match=r"Install Go .*python -m tests.cluster build"):
        build.binary_path("kwok")
    with pytest.raises(KeyError, match="declares 'no-such-tool'"):
        build.binary_path("no-such-tool")


def test_real_node_modules_build_only_when_asked():
    """scripts/test builds (and CI caches) the control plane only; kubelet & co. come with --real-node."""
    real_node_parts = {"kubelet", "kube-proxy", "coredns", "pause"}
    assert not real_node_parts & set(build.declared_names())
    assert real_node_parts <= set(build.declared_names(real_node=True))
    assert {m.name for m in build.module_dirs()} & {"node", "coredns", "pause"} == set()
    for module in build.module_dirs(real_node=True):
        assert (module / "go.sum").exists(), f"{module} has no committed go.sum"


def test_real_node_kubelet_follows_the_control_planes_kubernetes_pin():
    pin = re.compile(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", re.MULTILINE)
    control_plane = pin.search((build.GO_MODULES_DIR / "kubernetes" / "go.mod").read_text()).group(1)
    node = build.GO_MODULES_DIR / "node"
    assert pin.search((node / "go.mod").read_text()).group(1) == control_plane
    replaces = re.compile(r"^\s*(k8s\.io/\S+) => (\S+ \S+)$", re.MULTILINE)
    assert dict(replaces.findall((node / "go.mod").read_text())) == dict(
        replaces.findall((build.GO_MODULES_DIR / "kubernetes" / "go.mod").read_text()))
    for spec in build.parse_binaries(node):
        assert f"version.gitVersion={control_plane}" in spec.extra_ldflags, spec.name
