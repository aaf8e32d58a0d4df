"""The router fuzzed from its own OpenAPI document: benchmarks/openapi_fuzz.py, run whole (a real
router and sim nodes on loopback, `tiergate up`) with a fixed seed and a bounded number of
cases, positive and negative, over every operation: no server error, and every error reply is
the OpenAI error envelope. The benchmark's longer run, and its figures, are in
benchmarks/README.md.

tests/router/http/test_openapi_conformance.py checks the document against the router's parsing
(what one allows the other accepts); this checks the router's replies to what it generates.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "openapi_fuzz.py"
CASES, SEED = 400, 0


def test_no_generated_request_gets_a_server_error_or_a_bare_error() -> None:
    argv = [sys.executable, "-P", str(SCRIPT), "--cases", str(CASES), "--seeds", str(SEED),
            "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    (run,) = report["runs"]
    assert run["cases"] >= CASES * 0.9, run  # some operations have few distinct cases
    assert (run["server_errors"], run["envelope_violations"]) == (0, 0), report["failures"]
    assert done.returncode == 0
    # The cases reached the nodes (served, and refused by them), not only the router's checks.
    assert run["statuses"]["positive 200"] > 0
    assert any(k.startswith("positive 400 ") and k.split()[2] not in ("invalid_request",
               "invalid_cascade", "unknown_tier") for k in run["statuses"]), run  # fmt: skip


@pytest.fixture(scope="module")
def fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_fuzz", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


JSON = "application/json"
ENVELOPE = b'{"error": {"message": "no", "type": "invalid_request_error", "code": "x"}}'


@pytest.mark.parametrize(
    ("status", "content_type", "content", "kind"),
    [
        (200, JSON, b'{"choices": []}', None),
        (200, "text/event-stream", b"data: {}\n\ndata: [DONE]\n\n", None),
        (200, "text/event-stream", b"data: {}\n\n", "server error"),
        (200, "text/event-stream", b'data: {"error": {}}\n\ndata: [DONE]\n\n', "server error"),
        (400, JSON, ENVELOPE, None),
        (400, "text/plain", b"Invalid HTTP request received.", "envelope violation"),
        (400, JSON, b'{"error": "no"}', "envelope violation"),
        (400, JSON, b'{"error": {"message": "", "type": "t", "code": null}}',
         "envelope violation"),
        (400, JSON, ENVELOPE.replace(b"no", b"see http://10.0.0.1:8000"), "envelope violation"),
        (500, JSON, ENVELOPE, "server error"),
        (502, JSON, ENVELOPE, "server error"),
        (503, JSON, ENVELOPE.replace(b'"x"', b'"upstream_unavailable"'), "server error"),
        (503, JSON, ENVELOPE.replace(b'"x"', b'"slo_unattainable"'), None),
    ],
)  # fmt: skip
def test_the_fuzz_judges_replies_as_its_docstring_says(
    fuzz: ModuleType, status: int, content_type: str, content: bytes, kind: str | None
) -> None:
    assert fuzz.judge(status, content_type, content) == kind
