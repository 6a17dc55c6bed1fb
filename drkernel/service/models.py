"""Typed request and response bodies of the HTTP API (/v1).

Options are validated by pydantic against `EvalOptions` itself (a pydantic view of the dataclass that forbids
unknown names), so the field list, the types and the dataclass's own checks live in one place: `drkernel.schema`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from drkernel.schema import EvalOptions, EvalRequest

MAX_SOURCE_CHARS = 1_000_000  # per reference or candidate source
MAX_BATCH_ITEMS = 1000
SUBMISSION_TAGS = ("single", "batch")  # the two shapes of POST /v1/evaluations

# Unknown option names fail with their names in the error's location ("options", "<name>").
StrictOptions = pydantic.dataclasses.dataclass(config=ConfigDict(extra="forbid"))(EvalOptions)
Source = Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]


class EvaluationIn(BaseModel):
    """One evaluation: a reference task and a candidate (KernelBench format), with options."""

    model_config = ConfigDict(extra="forbid")

    reference: Source
    candidate: Source
    options: StrictOptions = Field(default_factory=StrictOptions)  # type: ignore[valid-type]
    task_name: str = Field(default="", max_length=1000)

    def to_request(self) -> EvalRequest:
        return EvalRequest(self.reference, self.candidate, EvalOptions.from_dict(self.options.to_dict()),
                           self.task_name)


class BatchIn(BaseModel):
    """Many evaluations in one request, stored together in one transaction."""

    model_config = ConfigDict(extra="forbid")

    items: list[EvaluationIn] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


def _shape(body: Any) -> str:
    single, batch = SUBMISSION_TAGS
    return batch if isinstance(body, dict) and "items" in body else single


# A body with "items" is a batch; anything else is validated as one evaluation (so errors name one shape only).
SubmissionIn = Annotated[
    Union[Annotated[EvaluationIn, Tag(SUBMISSION_TAGS[0])], Annotated[BatchIn, Tag(SUBMISSION_TAGS[1])]],
    Discriminator(_shape),
]


class SubmittedOut(BaseModel):
    id: str


class BatchSubmittedOut(BaseModel):
    ids: list[str]


class EvaluationOut(BaseModel):
    id: str
    state: Literal["queued", "running", "done"]
    result: dict[str, Any] | None = Field(description="EvalResult.to_dict() once done, else null")


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"
    device: str
