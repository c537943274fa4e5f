"""Kubernetes names and the problems that name a field: the API's group, version and kind, the DNS, label,
annotation and image reference rules the API server applies, and ``Problem`` / ``SpecInvalid``, of which every
refusal of a ForgeReplayJob is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

from forge_replay.errors import Portable

GROUP = "forgereplay.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ForgeReplayJob"
PLURAL = "forgereplayjobs"
SINGULAR = "forgereplayjob"
SHORT_NAMES = ["frj"]
CATEGORIES = ["forge-replay"]

MAX_NAME_LENGTH = 47  # KubeRay's RayJob name limit
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    rf"^(?:(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$"
)
"""An image reference as the container runtime parses one (github.com/distribution/reference: [domain[:port]/]path
[:tag][@digest], the path lowercase)."""

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""An environment variable name a shell and Ray's runtime env both take."""

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUALIFIED_NAME = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
TOTAL_ANNOTATION_BYTES = 256 * 1024  # k8s.io/apimachinery ValidateAnnotationsSize


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label/annotation key (a qualified name), or None
    (k8s.io/apimachinery/pkg/util/validation: IsQualifiedName)."""
    import re

    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return f"key {short_repr(key)} has more than one '/'"
    if "/" in key and not (len(prefix) <= 253 and re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        return f"key {short_repr(key)}: the prefix before '/' must be a DNS-1123 subdomain of at most 253 characters"
    if not (len(name) <= 63 and re.fullmatch(_QUALIFIED_NAME, name)):
        return (f"key {short_repr(key)}: the name must be 1-63 characters of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value, or None (IsValidLabelValue)."""
    import re

    if value and not (len(value) <= 63 and re.fullmatch(_QUALIFIED_NAME, value)):
        return (f"value {short_repr(value)} must be empty or 1-63 characters of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit")
    return None


def short_repr(text: str) -> str:
    """``repr(text)``, cut to 80 characters, for a message that quotes what it refuses."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def checked_image(value: str) -> str:
    """``value`` when it is empty or an image reference; SpecInvalid naming the field otherwise."""
    import re

    if value and not re.fullmatch(IMAGE_REFERENCE, value):
        raise SpecInvalid([Problem("", f"{short_repr(value)} is not an image reference "
                                   "([registry[:port]/]path[:tag][@digest], the path lowercase, no spaces)")])
    return value


def _check_labels(value: dict[str, str]) -> dict[str, str]:
    problems = [Problem(key, why) for key, item in value.items()
                for why in (label_key_problem(key), label_value_problem(item)) if why]
    if problems:
        raise SpecInvalid(problems)
    return value


def _check_annotations(value: dict[str, str]) -> dict[str, str]:
    problems = [Problem(key, why) for key in value if (why := label_key_problem(key))]
    size = sum(len(k) + len(v) for k, v in value.items())
    if size > TOTAL_ANNOTATION_BYTES:
        problems.append(Problem("", f"{size} bytes of annotations; the API server allows {TOTAL_ANNOTATION_BYTES}"))
    if problems:
        raise SpecInvalid(problems)
    return value


Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]
"""Label keys and values as the API server checks them (also node selectors)."""
Annotations = Annotated[dict[str, str], AfterValidator(_check_annotations)]
"""Annotation keys and total size as the API server checks them."""


@dataclass(frozen=True)
class Problem:
    """One reason a spec is refused: a dotted field path (camelCase, as in YAML) and a message."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecInvalid(Portable, ValueError):
    """A ForgeReplayJob (or a part of one) breaks the API rules; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
