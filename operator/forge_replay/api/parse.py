"""Turn YAML documents into validated ForgeReplayJobs, or into Problems that name the field."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from forge_replay.api.job import CROSS_FIELD_RULES, ForgeReplayJob, ForgeReplayJobSpec
from forge_replay.api.names import API_VERSION, KIND, Problem, SpecInvalid
from forge_replay.errors import Portable


class NotAForgeReplayJob(ValueError):
    """The document is not a ForgeReplayJob at all (wrong kind/apiVersion, or not a mapping)."""


class DocumentError(ValueError):
    """A file cannot be read or is not YAML."""


class DocumentInvalid(Portable, DocumentError):
    """YAML the API server would refuse (duplicate keys, alias bombs, runaway nesting); ``problems`` name
    the field and the line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


MAX_DOCUMENT_BYTES = 3 * 1024 * 1024
"""kube-apiserver refuses request bodies over 3 MiB (k8s.io/apiserver/pkg/server/config.go,
``MaxRequestBodyBytes``); a file larger than that can never be applied."""

MAX_NESTING = 100
"""Deepest nesting forge-replay reads (a ForgeReplayJob needs under 10 levels, a model config a few more).
The API server's own JSON limit (10000) is beyond what Python's recursion can validate."""

# gopkg.in/yaml.v2 decode.go (vendored by sigs.k8s.io/yaml, which kubectl and the API server decode YAML
# with): after more than 100 alias-expanded nodes in a document of more than 1000 decoded nodes, at most
# 99% of the nodes may come from alias expansion up to 400,000 decoded nodes, falling linearly to 10%
# at 4,000,000 ("document contains excessive aliasing").
_ALIAS_RANGE_LOW, _ALIAS_RANGE_HIGH = 400_000, 4_000_000

# go-yaml resolves plain scalars such as 1e-6 and 1e26 as floats; PyYAML (YAML 1.1) wants a dot and a
# signed exponent and would read them as strings (gopkg.in/yaml.v2 resolve.go, yamlStyleFloat).
_GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


def allowed_alias_ratio(decoded: int) -> float:
    """The share of a document's decoded nodes that may come from alias expansion (go-yaml's rule)."""
    if decoded <= _ALIAS_RANGE_LOW:
        return 0.99
    if decoded >= _ALIAS_RANGE_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_RANGE_LOW) / (_ALIAS_RANGE_HIGH - _ALIAS_RANGE_LOW)


def excessive_aliasing(decoded: int, aliased: int) -> bool:
    """True when go-yaml would stop with "document contains excessive aliasing"."""
    return aliased > 100 and decoded > 1000 and aliased / decoded > allowed_alias_ratio(decoded)


class _Refused(yaml.YAMLError):
    def __init__(self, path: str, message: str):
        self.problem = Problem(path, message)
        super().__init__(str(self.problem))


class _KubernetesYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the limits of the Kubernetes YAML path (sigs.k8s.io/yaml): duplicate keys,
    alias expansion and nesting are checked while composing, before anything walks the document.

    The decoded and aliased node counts follow go-yaml's decoder, which expands every alias: an alias
    counts one node plus the expanded size of its anchor, all of it aliased. Checking at the end of each
    alias is exact, since between aliases the aliased share only falls."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._path: list[str | int] = []
        self._reset()

    def _reset(self) -> None:
        self._decoded = self._aliased = self._deepest = 0
        self._expanded: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (nodes when expanded, height)

    def compose_document(self):
        self._reset()
        return super().compose_document()

    def _where(self) -> str:
        out = ""
        for part in self._path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out if len(out) <= 200 else f"{out[:120]}...{out[-60:]}"

    def compose_node(self, parent, index):
        pushed = index is not None
        if pushed:
            self._path.append(index if isinstance(index, int) else _key_text(index))
        try:
            return self._compose_checked(parent, index)
        finally:
            if pushed:
                self._path.pop()

    def _compose_checked(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        depth = len(self._path) + 1
        if isinstance(event, yaml.AliasEvent):
            anchored = self.anchors.get(event.anchor)
            if anchored is not None:
                if id(anchored) not in self._expanded:
                    raise _Refused(self._where(), f"line {line}: alias *{event.anchor} refers to a node that "
                                                  "contains it (the API server refuses a recursive alias)")
                nodes, height = self._expanded[id(anchored)]
                self._decoded += 1 + nodes
                self._aliased += nodes
                self._deepest = max(self._deepest, depth - 1 + height)
                if excessive_aliasing(self._decoded, self._aliased):
                    raise _Refused(self._where(), f"line {line}: alias *{event.anchor} expands the document to "
                                                  f"{self._decoded} nodes, {self._aliased} of them from aliases; "
                                                  "the API server refuses such excessive aliasing (an alias bomb)")
                if depth - 1 + height > MAX_NESTING:
                    raise _Refused(self._where(), f"line {line}: alias *{event.anchor} nests deeper than "
                                                  f"{MAX_NESTING} levels")
            return super().compose_node(parent, index)
        if depth > MAX_NESTING:
            raise _Refused(self._where(), f"line {line}: nested deeper than {MAX_NESTING} levels")
        self._decoded += 1
        before, outer_deepest = self._decoded, self._deepest
        self._deepest = depth
        node = super().compose_node(parent, index)
        if getattr(event, "anchor", None) is not None:
            self._expanded[id(node)] = (self._decoded - before + 1, self._deepest - depth + 1)
        self._deepest = max(outer_deepest, self._deepest)
        if isinstance(node, yaml.MappingNode):
            self._refuse_duplicate_keys(node)
        return node

    def _refuse_duplicate_keys(self, node: yaml.MappingNode) -> None:
        first: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            line = key.start_mark.line + 1
            seen = first.get((key.tag, key.value))
            first.setdefault((key.tag, key.value), line)
            if seen is not None:
                self._path.append(_key_text(key))
                where = self._where()
                self._path.pop()
                raise _Refused(where, f"duplicate key {_key_text(key)!r} at line {line} (first at line {seen}); "
                                      "the API server refuses duplicate fields")


def _key_text(node: yaml.Node) -> str:
    text = node.value if isinstance(node, yaml.ScalarNode) else f"<{node.id}>"
    return text if len(text) <= 60 else text[:57] + "..."


_KubernetesYamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", _GO_FLOAT, list("-+.0123456789"))


def load_yaml_documents(text: str) -> list[Any]:
    """Every non-empty YAML document of ``text``, read within the API server's limits.

    Raises DocumentInvalid (field path and line) for YAML the API server refuses, yaml.YAMLError otherwise."""
    loader = _KubernetesYamlLoader(text)
    try:
        docs = []
        while loader.check_data():
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
        return docs
    except _Refused as exc:
        raise DocumentInvalid([exc.problem]) from None
    except RecursionError:  # defensive: MAX_NESTING keeps well below Python's limit
        raise DocumentInvalid([Problem("", f"nested too deeply (more than {MAX_NESTING} levels)")]) from None
    finally:
        loader.dispose()


def load_documents(path: str | Path) -> list[Any]:
    """Read every YAML document of ``path`` (``-`` is stdin), skipping empty ones."""
    import sys

    try:
        if str(path) == "-":
            text = sys.stdin.read(MAX_DOCUMENT_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_DOCUMENT_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
    if len(text.encode("utf-8")) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB, the API server's request limit")
    try:
        return load_yaml_documents(text)
    except DocumentInvalid:
        raise
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {' '.join(str(exc).split())[:300]}") from exc


def check_kind(doc: Any) -> None:
    """Raise NotAForgeReplayJob unless ``doc`` declares this API's kind and apiVersion."""
    if not isinstance(doc, dict):
        raise NotAForgeReplayJob(f"a document is a {type(doc).__name__}, not a ForgeReplayJob mapping")
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind != KIND or api_version != API_VERSION:
        raise NotAForgeReplayJob(
            f"kind {kind!r} apiVersion {api_version!r} is not a ForgeReplayJob "
            f"(expected kind: {KIND}, apiVersion: {API_VERSION})"
        )


def other_kind(doc: Any) -> str | None:
    """The kind of a Kubernetes object that is not a ForgeReplayJob (a ConfigMap in a GitOps folder), else None.
    A mapping without a kind, or kind ForgeReplayJob with another apiVersion, is a broken job, not another kind."""
    if isinstance(doc, dict) and isinstance(doc.get("kind"), str) and doc["kind"] and doc["kind"] != KIND:
        return doc["kind"]
    return None


def parse_job(doc: Any) -> ForgeReplayJob:
    """Validate one document as a ForgeReplayJob.

    Raises NotAForgeReplayJob for other kinds and SpecInvalid (with field-path Problems) for
    ForgeReplayJobs that break the API rules; never any other exception for any input.
    """
    check_kind(doc)
    try:
        return ForgeReplayJob.model_validate(doc)
    except ValidationError as exc:
        problems = problems_from(exc, ForgeReplayJob)
        problems += [p for p in rule_problems_despite(doc, exc) if p not in problems]
        raise SpecInvalid(problems) from None
    except SpecInvalid:
        raise
    except (TypeError, ValueError, RecursionError) as exc:  # defensive: odd YAML values
        raise SpecInvalid([Problem("", f"cannot be validated: {exc}")]) from None


def problems_from(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> list[Problem]:
    """Translate a pydantic ValidationError into Problems with camelCase dotted paths."""
    problems: list[Problem] = []
    for err in exc.errors():
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, SpecInvalid):
            base = _dotted(err["loc"], prefix)
            for p in inner.problems:
                # Cross-field rules report full paths already when raised at the spec or job level.
                problems.append(p if p.path.startswith(("spec", "metadata")) or not base else Problem(
                    f"{base}.{p.path}" if p.path else base, p.message))
            continue
        problems.append(Problem(_dotted(err["loc"], prefix), _message(err, root)))
    return problems


def _dotted(loc: tuple[Any, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _message(err: dict[str, Any], root: type[BaseModel]) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        allowed = _allowed_fields(root, err["loc"][:-1])
        name = str(err["loc"][-1])
        hint = difflib.get_close_matches(name, allowed, n=1)
        text = "unknown field"
        if hint:
            text += f"; did you mean {hint[0]!r}?"
        if allowed:
            text += f" (allowed: {', '.join(allowed)})"
        return text
    if kind == "value_error":  # our own validators already name the offending value
        return _lower_first(msg.removeprefix("Value error, "))
    if "input" not in err or isinstance(err["input"], (dict, list)):
        return _lower_first(msg)
    shown = repr(err["input"])
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{_lower_first(msg)} (got {shown})"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _allowed_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """camelCase field names of the model reached by following ``loc`` from ``root``."""
    import typing

    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part or name == part), None
        )
        if field is None:
            return []
        model = _unwrap(field.annotation, typing)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _unwrap(annotation: Any, typing: Any) -> Any:
    """The model class inside Optional[...] / list[...] annotations."""
    while True:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        origin = typing.get_origin(annotation)
        if origin is None or not args:
            return annotation
        annotation = args[-1] if origin is dict else args[0]


# --------------------------------------------------------------- cross-field rules next to field errors


class _Unchecked(Exception):
    """A cross-field rule read a field that is itself invalid: the rule cannot be judged yet."""


class _Invalid:
    """Stands for an invalid field while the cross-field rules run: any use of it skips the rule.
    (``x is None`` stays False, which is right: the field was given.)"""

    def _skip(self, *_: Any, **__: Any) -> Any:
        raise _Unchecked

    __getattr__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _skip
    __bool__ = __iter__ = __len__ = __contains__ = __mod__ = __rmod__ = __int__ = _skip
    __hash__ = None  # type: ignore[assignment]


def rule_problems_despite(doc: Any, exc: ValidationError) -> list[Problem]:
    """The cross-field rules' problems of a job whose fields are not all valid, as the API server lists its
    CEL rules' messages next to the schema's: pydantic runs the rules only once every field is valid.

    Every field without an error is validated on its own; a rule that reads an invalid field is skipped."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    bad = [tuple(e["loc"][1:]) for e in exc.errors() if e["loc"][:1] == ("spec",)]
    if not isinstance(spec, dict) or not bad or () in bad:  # () is the rules' own error: they all ran
        return []
    partial = _partial(ForgeReplayJobSpec, spec, bad)
    problems: list[Problem] = []
    for rule in CROSS_FIELD_RULES:
        try:
            problems += rule.check(partial)
        except _Unchecked:
            continue
    return problems


def _partial(model: type[BaseModel], raw: dict[str, Any], bad: list[tuple[Any, ...]]) -> BaseModel:
    """``model`` built from ``raw`` without validation of the whole: each field validated on its own,
    ``_Invalid`` for the fields at (or, unless a model, under) an error location in ``bad``."""
    import typing

    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        under = [loc[1:] for loc in bad if loc[:1] == (key,)]
        if key not in raw:
            values[name] = _Invalid() if field.is_required() else field.get_default(call_default_factory=True)
            continue
        inner = _unwrap(field.annotation, typing)
        if () not in under and under and isinstance(raw[key], dict) and isinstance(inner, type) \
                and issubclass(inner, BaseModel):
            values[name] = _partial(inner, raw[key], under)
        elif under:
            values[name] = _Invalid()
        else:
            try:
                values[name] = _field_adapter(model, name).validate_python(raw[key])
            except (ValidationError, SpecInvalid):
                values[name] = _Invalid()
    return model.model_construct(**values)


_ADAPTERS: dict[tuple[type, str], Any] = {}


def _field_adapter(model: type[BaseModel], name: str) -> Any:
    from typing import Annotated

    from pydantic import TypeAdapter

    if (model, name) not in _ADAPTERS:
        field = model.model_fields[name]
        _ADAPTERS[model, name] = TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata
                                             else field.annotation)
    return _ADAPTERS[model, name]
