"""`tiergate demo` sends an even mix of the tiers the router says it serves."""

from __future__ import annotations

import pytest

from tiergate.cli import main
from tiergate.common.cli import CliError
from tiergate.common.tiers import TIERS
from tiergate.local import demo_cmd
from tiergate.local.demo_cmd import even_mix


def models(*tiers_per_model: list[str] | None) -> dict[str, object]:
    entries: list[dict[str, object]] = []
    for i, tiers in enumerate(tiers_per_model):
        entries.append({"id": f"m{i}", **({"tiers": tiers} if tiers is not None else {})})
    return {"object": "list", "data": entries}


def test_every_served_tier_once_in_the_tiers_order() -> None:
    served = models([TIERS[-1]], list(reversed(TIERS)), [TIERS[0]])
    assert even_mix(served) == ",".join(f"{t}=1" for t in TIERS)


def test_a_tier_no_pool_serves_is_left_out() -> None:
    assert even_mix(models([TIERS[1]], None)) == f"{TIERS[1]}=1"


def test_no_served_tier_is_an_error() -> None:
    with pytest.raises(CliError, match="serves no tier"):
        even_mix(models(None))


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--requests", "0", "must be at least 1"),
        ("--requests", "10000001", "must be at most 10000000"),
        ("--requests", "99999999999999999999", "must be at most 10000000"),
        ("--concurrency", "0", "must be at least 1"),
        ("--concurrency", "99999999999999999999", "must be at most 100000"),
    ],
)
def test_a_count_out_of_range_is_one_line_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    value: str,
    words: str,
) -> None:
    monkeypatch.setattr(demo_cmd, "run", lambda args: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as exited:
        main(["demo", flag, value])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and f"argument {flag}: {words}" in err
