"""`RequestResult`: how one bench request went (the client fills it, the stats read it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestResult"]


@dataclass(slots=True)
class RequestResult:
    """How one request went. Times are seconds from sending it."""

    index: int
    requested_tier: str
    served_tier: str
    model: str
    pool: str | None = None
    status: int | None = None
    error: str | None = None
    error_message: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0  # from the reply's usage; 0 when it has none
    cost_usd: float | None = None
    tool_call_expected: bool = False
    tool_call_valid: bool | None = None  # None: no tools sent, or the request failed
    tool_call_problem: str | None = None
    escalated: bool = False
    tenant: str | None = None  # the --tenants entry that sent it; None without --tenants
    retry_after_s: float | None = None  # a 429's Retry-After, when it gave a number of seconds
    sent_at: float | None = None  # when it was sent, Unix time (for --requests-jsonl)

    @property
    def ok(self) -> bool:
        return self.error is None
