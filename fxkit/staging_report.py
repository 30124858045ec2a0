"""What ``fxkit stage --json`` prints, declared once: the CLI writes these models and the ``stage``
operation (:mod:`fxkit.ops.checkpoints`) reads them back from the host's output.

- ``fxkit stage --plan --json`` prints a :class:`PlanReport`: what a run would do;
- ``fxkit stage --json`` prints a :class:`Summary`: what the run did.

Each is one line of JSON whose keys are the model's fields (``copy`` and ``check`` for a plan's
``to_copy`` and ``to_check``), the summary's derived values (``gb_copied``, ``gb_skipped``,
``rate_gbps``) after them. Reading one (:meth:`Report.read`) ignores keys it does not know (a newer
fxkit on the host may add some); a missing key or a value of the wrong type is a
:class:`ReportError` naming the key, what was wanted and what came.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    field_serializer,
)

from fxkit.errors import FxkitError


class ReportError(FxkitError):
    """The output of ``fxkit stage --json`` is not the report it should be."""


class Report(BaseModel):
    """One line of JSON printed by ``fxkit stage``: written with :meth:`to_json`, read back
    with :meth:`read`."""

    # Strict: a count sent as "12" or a list sent as a string is a mistake, not a value.
    model_config = ConfigDict(strict=True, extra="ignore")
    #: What the report is called in messages.
    what: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The report as ``fxkit stage --json`` prints it (``json.dumps`` of this)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def read(cls, output: str, command: str) -> Self:
        """The report on the last line of ``output``, printed by ``command``; a
        :class:`ReportError` when there is none, or when it is malformed."""
        lines = output.strip().splitlines()
        try:
            data = json.loads(lines[-1]) if lines else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ReportError(f"{command} printed no JSON object: {output[-300:]!r}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ReportError(
                f"{command} printed a {cls.what} this fxkit cannot read: {_problems(exc)}",
                hint="the host's fxkit and this one differ: install this fxkit's version there",
            ) from None


def _problems(exc: ValidationError) -> str:
    """Each wrong key in words: ``copy: Input should be a valid list (got 'a.bin')``."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        if error["type"] == "missing":
            problems.append(f"{where}: missing")
        else:
            problems.append(f"{where}: {error['msg']} (got {error['input']!r:.60})")
    return "; ".join(problems)


class PlanReport(Report):
    """``fxkit stage --plan --json``: what staging would copy, check and skip (nothing done)."""

    model_config = ConfigDict(frozen=True)
    what = "plan"

    #: Always true: tells a plan from a :class:`Summary`.
    plan: Literal[True] = True
    source: str
    dest: str
    #: Files in the source.
    files: int = Field(ge=0)
    #: Files to copy (not in ``dest``, a partial to resume, or the wrong size).
    to_copy: list[str] = Field(alias="copy")
    #: Files in ``dest`` with the right size but no record that vouches for them: hashed.
    to_check: list[str] = Field(alias="check")
    #: Files recorded as staged from this source: left alone.
    skip: int = Field(ge=0)
    bytes_to_copy: int = Field(ge=0)
    bytes_to_check: int = Field(ge=0)
    #: What the source's listing skipped and what the manifest could not vouch for.
    warnings: list[str] = []


class Summary(Report):
    """``fxkit stage --json``: what a run did (counted as it goes)."""

    what = "summary"

    source: str
    dest: str
    #: Files in the source.
    files: int = Field(ge=0)
    copied: int = Field(default=0, ge=0)
    #: Files left as they were (``checked`` ones among them).
    skipped: int = Field(default=0, ge=0)
    #: Copies that went on from a partial left by an earlier run.
    resumed: int = Field(default=0, ge=0)
    #: Files in ``dest`` hashed and found equal to the source.
    checked: int = Field(default=0, ge=0)
    bytes_copied: int = Field(default=0, ge=0)
    bytes_skipped: int = Field(default=0, ge=0)
    seconds: float = Field(default=0.0, ge=0)
    verify: bool = False
    #: The algorithm the copies were checked with (fxkit.staging.CHECKSUMS).
    checksum: str
    copied_files: list[str] = []
    warnings: list[str] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gb_copied(self) -> float:
        return self.bytes_copied / 1e9

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gb_skipped(self) -> float:
        return self.bytes_skipped / 1e9

    @computed_field  # type: ignore[prop-decorator]
    @property
    def rate_gbps(self) -> float:
        """Bytes copied per second, in GB/s."""
        return self.bytes_copied / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @field_serializer("gb_copied", "gb_skipped", "rate_gbps")
    def _printed(self, value: float) -> float:
        """Derived values are printed to 3 decimals."""
        return round(value, 3)
