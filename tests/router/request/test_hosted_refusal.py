"""`hosted_refusal`: a provider's error envelope told in the pool's names (router/request/
refusal.py); the relay through a real router is in test_hosted_pools.py."""

from __future__ import annotations

import json

from tiergate.router.request.refusal import hosted_refusal


def test_every_string_of_the_error_names_the_clients_model_and_the_rest_passes() -> None:
    body = json.dumps({
        "error": {"message": "model gpt-x-2026 not found", "type": "invalid_request_error",
                  "param": "gpt-x-2026", "code": "model_not_found:gpt-x-2026", "line": 3},
        "extra": "gpt-x-2026",
    }).encode()  # fmt: skip
    out = json.loads(hosted_refusal(body, 404, "gpt-x-2026", "chat"))
    assert out["error"] == {"message": "model chat not found", "type": "invalid_request_error",
                            "param": "chat", "code": "model_not_found:chat", "line": 3}  # fmt: skip


def test_a_body_that_is_no_envelope_becomes_one_that_says_only_the_status() -> None:
    for body in (b"<html>gpt-x-2026</html>", b'{"error": "gpt-x-2026"}', b"[1]", b"\xff"):
        out = json.loads(hosted_refusal(body, 422, "gpt-x-2026", "chat"))
        assert out["error"]["type"] == "invalid_request_error"
        assert "HTTP 422" in out["error"]["message"] and "gpt-x" not in str(out)
