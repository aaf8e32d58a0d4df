"""The gateway configuration docs/operations/gateway.md shows is the one the gateway tests run
(tools/envoy_gateway.py), `message_timeout` included, and that timeout leaves the picker time to
refuse a pick it cannot make before the gateway gives up on it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from envoy_gateway import GatewayConfig

from tiergate.router.epp.deadline import MESSAGE_TIMEOUT_S, PICK_WITHIN_S

GUIDE = Path(__file__).parents[3] / "docs" / "operations" / "gateway.md"
EXT_PROC = "envoy.filters.http.ext_proc"


def documented_ext_proc_filters() -> list[dict[str, Any]]:
    """The ext_proc filters' `typed_config` in the guide's YAML blocks, in order."""
    found = []
    for block in re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.DOTALL):
        parsed = yaml.safe_load(block)
        filters = parsed.get("http_filters", []) if isinstance(parsed, dict) else parsed
        for entry in filters if isinstance(filters, list) else []:
            if isinstance(entry, dict) and entry.get("name") == EXT_PROC:
                found.append(entry["typed_config"])
    return found


def harness_ext_proc_filter(**settings: Any) -> dict[str, Any]:
    """The ext_proc filter's `typed_config` of the test gateway with `settings`."""
    resources = GatewayConfig(epp_port=9002, **settings).bootstrap()["static_resources"]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (ext_proc,) = [f["typed_config"] for f in hcm["http_filters"] if f["name"] == EXT_PROC]
    return dict(ext_proc)


def shown_in(shown: Any, tested: Any) -> bool:
    """Whether every setting `shown` has is `tested`'s."""
    if isinstance(shown, dict) and isinstance(tested, dict):
        return all(key in tested and shown_in(value, tested[key]) for key, value in shown.items())
    return bool(shown == tested)


def test_the_documented_fail_close_filter_is_the_tested_one() -> None:
    fail_close, _ = documented_ext_proc_filters()
    assert fail_close == harness_ext_proc_filter()


def test_the_documented_fail_open_filter_is_the_tested_one() -> None:
    _, fail_open = documented_ext_proc_filters()
    assert fail_open["failure_mode_allow"] is True
    assert shown_in(fail_open, harness_ext_proc_filter(fail_open=True, fallback="10.0.0.1:8000"))


def test_the_gateway_waits_for_a_pick_longer_than_the_picker_lets_it_take() -> None:
    for documented in documented_ext_proc_filters():
        seconds = float(str(documented["message_timeout"]).removesuffix("s"))
        assert seconds == MESSAGE_TIMEOUT_S and seconds > PICK_WITHIN_S, documented
