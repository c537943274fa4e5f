"""The base every API model shares (camelCase aliases, unknown fields rejected) and the number types the API server
reads: strict integers and finite floats."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel

Int = Annotated[int, Strict()]
"""An integer as the API server reads one: no bool, no '4', no 4.0."""
FiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]
"""A number that JSON (and so the API server) can carry: no .inf, no .nan, no '1e-6' string."""


class ApiModel(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignment validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
    )


def described(text: str) -> Any:
    """A field with no default, described in the CRD by ``text``."""
    return Field(description=text)
