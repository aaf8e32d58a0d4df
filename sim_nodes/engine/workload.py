"""Workloads for simulation: when requests arrive and how long their prompts and outputs are.

Arrivals are a seeded Poisson process (or all at once) or a JSONL trace; lengths are fixed,
uniform or lognormal, written as short specs (`1000`, `uniform:500:1500`,
`lognormal:1000:0.5`) so they fit on a command line.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tiergate.common.validation import first_problem

__all__ = [
    "MAX_ARRIVAL_S",
    "MAX_RATE_PER_S",
    "MAX_SIGMA",
    "MAX_TOKENS",
    "MIN_RATE_PER_S",
    "LengthDistribution",
    "TraceRecord",
    "WorkloadError",
    "WorkloadRequest",
    "load_trace",
    "parse_length",
    "poisson_workload",
]


#: The most tokens a length spec or trace line may give a prompt or an output: beyond any
#: model's context, and small enough that token counts stay finite floats in every formula.
MAX_TOKENS = 1_000_000_000
#: The widest lognormal sigma: far past any real length distribution (whose sigmas are about
#: 0.3 to 2), and narrow enough that a sample's exponent cannot overflow.
MAX_SIGMA = 100.0
#: The latest arrival a trace may state, in seconds (about 32 years): times past it lose the
#: precision a latency needs (a float's step at 1e15 s is 0.125 s, so every latency reads 0).
MAX_ARRIVAL_S = 1e9
#: Poisson rates, arrivals per second: from one request every 17 minutes to a million a
#: second (the slowest keeps a million requests' arrivals under MAX_ARRIVAL_S).
MIN_RATE_PER_S = 0.001
MAX_RATE_PER_S = 1_000_000.0


class WorkloadError(ValueError):
    """A malformed length spec or trace file; the message says where."""


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One request of a workload (`cached_prompt_tokens`: its prompt's prefix-cache hit)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Token counts: `fixed` (a), `uniform` (a..b inclusive) or `lognormal` (mean a, sigma b).

    For lognormal, `a` is the mean token count and `b` the sigma of the underlying normal, so
    changing sigma widens the tail without moving the mean. Samples are at least 1.
    `parse_length` keeps the parameters within MAX_TOKENS and MAX_SIGMA.
    """

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        """One token count drawn with `rng`."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        mu = math.log(self.a) - self.b * self.b / 2.0
        return max(1, round(rng.lognormvariate(mu, self.b)))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{int(self.b)}"
        return f"lognormal:{self.a:g}:{self.b:g}"


def parse_length(text: str) -> LengthDistribution:
    """Parse `N`, `uniform:A:B` or `lognormal:MEAN:SIGMA` (token counts at most MAX_TOKENS,
    SIGMA at most MAX_SIGMA); raises WorkloadError."""
    parts = text.strip().split(":")
    try:
        if len(parts) == 1:
            n = int(parts[0])
            if not 1 <= n <= MAX_TOKENS:
                raise WorkloadError(f"token count must be in 1..{MAX_TOKENS}, got {n}")
            return LengthDistribution("fixed", n)
        kind = parts[0]
        if kind == "uniform" and len(parts) == 3:
            low, high = int(parts[1]), int(parts[2])
            if not 1 <= low <= high <= MAX_TOKENS:
                raise WorkloadError(f"uniform needs 1 <= A <= B <= {MAX_TOKENS}, got {low}:{high}")
            return LengthDistribution("uniform", low, high)
        if kind == "lognormal" and len(parts) == 3:
            mean, sigma = float(parts[1]), float(parts[2])
            if not (1 <= mean <= MAX_TOKENS and 0 <= sigma <= MAX_SIGMA):
                raise WorkloadError(
                    f"lognormal needs 1 <= MEAN <= {MAX_TOKENS} and 0 <= SIGMA <= "
                    f"{MAX_SIGMA:g}, got {text!r}"
                )
            return LengthDistribution("lognormal", mean, sigma)
    except ValueError as exc:
        if isinstance(exc, WorkloadError):
            raise
    raise WorkloadError(f"bad length {text!r}: expected N, uniform:A:B or lognormal:MEAN:SIGMA")


def poisson_workload(
    requests: int,
    rate_per_s: float | None,
    prompt: LengthDistribution,
    output: LengthDistribution,
    rng: random.Random,
) -> list[WorkloadRequest]:
    """`requests` requests with exponential inter-arrival gaps at `rate_per_s` (None: all at
    time 0, an offline batch)."""
    if requests < 0:
        raise WorkloadError(f"requests must not be negative, got {requests}")
    if rate_per_s is not None and not MIN_RATE_PER_S <= rate_per_s <= MAX_RATE_PER_S:
        raise WorkloadError(
            f"rate must be from {MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:,.0f} arrivals per "
            f"second, got {rate_per_s:g}"
        )
    out: list[WorkloadRequest] = []
    t = 0.0
    for _ in range(requests):
        if rate_per_s is not None:
            t += rng.expovariate(rate_per_s)
        out.append(WorkloadRequest(t, prompt.sample(rng), output.sample(rng)))
    return out


class TraceRecord(BaseModel):
    """One line of a trace file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival_s: float = Field(
        ge=0, le=MAX_ARRIVAL_S, allow_inf_nan=False, description="Arrival time, seconds."
    )
    prompt_tokens: int = Field(ge=1, le=MAX_TOKENS, description="Prompt length, tokens.")
    output_tokens: int = Field(ge=1, le=MAX_TOKENS, description="Tokens to generate.")


def load_trace(path: Path | str, limit: int | None = None) -> list[WorkloadRequest]:
    """Requests from a JSONL trace (one TraceRecord per line; blank lines skipped), sorted by
    arrival. `limit`: keep the first `limit` lines. Raises WorkloadError naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"trace {str(path)!r} is not UTF-8 text") from None
    records = list(_parse_lines(path, text.splitlines(), limit))
    if not records:
        raise WorkloadError(f"trace {str(path)!r} has no requests")
    records.sort(key=lambda r: r.arrival_s)
    return records


def _parse_lines(path: Path, lines: Iterable[str], limit: int | None) -> Iterable[WorkloadRequest]:
    count = 0
    for number, line in enumerate(lines, start=1):
        if limit is not None and count >= limit:
            return
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
        except ValueError:  # an integer of more digits than Python converts
            raise WorkloadError(f"{where}: not JSON (a number too long)") from None
        try:
            record = TraceRecord.model_validate(raw)
        except ValidationError as exc:
            problem = first_problem(exc, default_field="record")
            raise WorkloadError(f"{where}: {problem}") from None
        count += 1
        yield WorkloadRequest(record.arrival_s, record.prompt_tokens, record.output_tokens)
