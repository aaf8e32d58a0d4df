"""Benchmark: the router's own OpenAPI document turned against it.

Schemathesis generates requests from /openapi.json for every operation: positive cases (what
the document allows) and negative ones (what it does not: wrong types, missing fields, values
out of range, bodies that are not JSON, odd headers). Two in three positive completion cases
ask for a served model (else nearly all would be 404s), and half of those are tidied into what
the nodes serve (no SLO header, messages with a role and text, one prompt); every cap is held
to 64 tokens and n to 4 (else a few cases would decode for minutes). Each case is sent to a
real router on loopback, with real sim nodes behind it (`tiergate up`: batched, premium and
wafer-scale pools), one at a time, and its reply judged:

- server error: a 5xx but a 503 `slo_unattainable` (an SLO header can ask for the
  impossible), a stream that ends with an error event or without [DONE], a connection closed
  without a reply, or no reply within --timeout-s;
- envelope violation: a 4xx or 5xx whose body is not the OpenAI error envelope
  `{"error": {"message": str, "type": str, "code": ...}}`, or that shows a traceback or a
  node's address.

Prints, per seed, the cases run by operation and mode, the failures of each kind (the first
few of each in full) and cases per second; `--json` prints the totals as JSON instead. Exits 1
when any case failed. Runs are reproducible: each seed generates the same cases every time.

    .venv/bin/python -P benchmarks/openapi_fuzz.py [--cases 3000] [--seeds 0 1 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tiergate.router.http.openapi import openapi_document

#: The pools of the system under test: the 8B model on one wafer-scale chip (fast tokens).
CONFIG = """\
router: {{ledgerPath: {ledger}}}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 16}}, replicas: 2}}
  - {{name: p, tier: premium, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 4}}, replicas: 1}}
  - {{name: w, tier: wafer-scale, model: llama-3.1-8b, accelerator: wse-3,
      servedModelName: coder-spark, batching: {{maxNumSeqs: 8}}, replicas: 1}}
"""
NODES = 4
SERVED = ("coder", "coder-spark")
#: Cascades the router serves (the document's pattern allows any `a>b`).
CASCADES = ("wafer-scale>premium", "wafer-scale>batched", "batched>premium")
#: Caps a case may ask for (larger ones are lowered to this).
MOST_TOKENS, MOST_SEQUENCES = 64, 4
#: 503s that are the router's answer to what was asked, not a failure.
REFUSALS_5XX = {(503, "slo_unattainable")}
#: The codes of the 400s the router gives itself (a node's refusals are passed on as they are).
ROUTER_400S = ("invalid_request", "invalid_cascade", "unknown_tier")
INTERNAL = re.compile(rb"https?://|127\.0\.0\.1|localhost|Traceback")
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")
#: Shares of the cases: each completion endpoint, positive and negative; the rest share
#: what is left.
SHARES = {(path, mode): 0.2 for path in COMPLETIONS for mode in ("positive", "negative")}


@dataclass
class Failure:
    kind: str  # server error | envelope violation
    case: str
    reply: str


@dataclass
class Run:
    seed: int
    cases: Counter[str] = field(default_factory=Counter)
    #: Replies by mode, status and, for errors, code ("positive 400 invalid_request").
    statuses: Counter[str] = field(default_factory=Counter)
    #: Positive cases (the document allows them) the router itself refused with a 400.
    refused_positive: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    not_sent: int = 0  # cases the client library could not send (a header it refuses)
    seconds: float = 0.0

    def count(self, kind: str) -> int:
        return sum(1 for f in self.failures if f.kind == kind)

    def summary(self) -> dict[str, Any]:
        total = sum(self.cases.values())
        return {
            "seed": self.seed,
            "cases": total,
            "server_errors": self.count("server error"),
            "envelope_violations": self.count("envelope violation"),
            "not_sent": self.not_sent,
            "positive_refused_by_router": len(self.refused_positive),
            "cases_per_s": round(total / self.seconds, 1) if self.seconds else 0.0,
            "by_operation": dict(sorted(self.cases.items())),
            "statuses": dict(sorted(self.statuses.items())),
        }


# -- the system under test --------------------------------------------------------------------


def free_ports(count: int) -> int:
    """The first of `count` consecutive loopback ports that are free now (sim nodes need real
    ports; the router takes any)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65535:
            continue
        held = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


@contextmanager
def system(workdir: Path) -> Iterator[str]:
    """`tiergate up` with CONFIG; yields the router's URL once it is ready; stops it at exit."""
    config = workdir / "up.yaml"
    config.write_text(CONFIG.format(ledger=workdir / "ledger.sqlite"))
    log = workdir / "up.log"
    argv = [sys.executable, "-P", "-m", "tiergate", "up", "--config", str(config),
            "--port", "0", "--metrics-port", "0",
            "--first-node-port", str(free_ports(NODES))]  # fmt: skip
    with log.open("wb") as out:
        up = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None or not _ready(url):
            if up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tiergate up did not start:\n{log.read_text()[-2000:]}")
            found = re.search(r"^router: (http://\S+)", log.read_text(), re.M)
            url = found.group(1) if found else None
            time.sleep(0.1)
        yield url
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def _ready(url: str) -> bool:
    try:
        return requests.get(url + "/readyz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


# -- cases ------------------------------------------------------------------------------------


def strategies() -> dict[tuple[str, str], tuple[st.SearchStrategy[Any], float]]:
    """(operation, mode) -> its cases and its share of the run."""
    schema = schemathesis.openapi.from_dict(openapi_document())
    out: dict[tuple[str, str], tuple[st.SearchStrategy[Any], float]] = {}
    for path in COMPLETIONS:
        operation = schema[path]["POST"]
        positive = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
        aims = st.tuples(
            positive, st.sampled_from((*SERVED, None)), st.sampled_from(CASCADES), st.booleans()
        )
        out[(path, "positive")] = (aims.map(_aimed), SHARES[(path, "positive")])
        negative = operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)
        out[(path, "negative")] = (negative.map(_held), SHARES[(path, "negative")])
    rest = 1 - sum(SHARES.values())
    reads = schema.include(method="GET")
    out[("GET *", "positive")] = (
        reads.as_strategy(generation_mode=GenerationMode.POSITIVE),
        rest / 2,
    )
    out[("GET *", "negative")] = (
        reads.as_strategy(generation_mode=GenerationMode.NEGATIVE),
        rest / 2,
    )
    return out


def _aimed(drawn: tuple[Any, str | None, str, bool]) -> Any:
    """A positive completion case asking for `model` and, if it asks for a cascade, for
    `cascade`; `tidy`: also without SLO headers, with messages a node reads (a role and text)
    and one prompt (model None: the case as generated). Caps held."""
    case, model, cascade, tidy = drawn
    body = case.body
    if model is not None and isinstance(body, dict):
        body["model"] = model
        headers = case.headers or {}
        if "x-tiergate-cascade" in headers:
            headers["x-tiergate-cascade"] = cascade
        if tidy:
            for name in ("x-slo-ttft-ms", "x-slo-tpot-ms"):
                headers.pop(name, None)
            for message in body.get("messages") or []:
                if not isinstance(message.get("content"), str):
                    message["content"] = "hi"
                if message.get("role") not in ("system", "user", "assistant"):
                    message["role"] = "user"
            prompt = body.get("prompt")
            if isinstance(prompt, list) and isinstance(prompt[0], str | list):
                body["prompt"] = prompt[0]  # the nodes take one prompt a request
    return _held(case)


def _held(case: Any) -> Any:
    """`case` with its caps and sequence counts lowered to what decodes in a moment."""
    body = case.body
    if isinstance(body, dict):
        for name, most in (("max_tokens", MOST_TOKENS), ("max_completion_tokens", MOST_TOKENS),
                           ("n", MOST_SEQUENCES), ("best_of", MOST_SEQUENCES)):  # fmt: skip
            value = body.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > most:
                body[name] = most
    return case


# -- judging ----------------------------------------------------------------------------------


def judge(status: int, content_type: str, content: bytes) -> str | None:
    """The failure a reply is (`server error`, `envelope violation`), or None."""
    if status >= 400:
        error = _envelope(content_type, content)
        if error is None or INTERNAL.search(content):
            return "envelope violation"
        if status >= 500 and (status, error["code"]) not in REFUSALS_5XX:
            return "server error"
        return None
    if content_type.startswith("text/event-stream"):
        events = [x[6:] for x in content.decode(errors="replace").splitlines()
                  if x.startswith("data: ")]  # fmt: skip
        if not events or events[-1] != "[DONE]" or any('"error"' in e[:20] for e in events):
            return "server error"
    return None


def _envelope(content_type: str, content: bytes) -> dict[str, Any] | None:
    if not content_type.startswith("application/json"):
        return None
    try:
        error = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    fine = (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and isinstance(error.get("type"), str)
        and "code" in error
    )
    return error if fine else None


def describe(case: Any) -> str:
    body = case.body if isinstance(case.body, dict | list | str) else repr(case.body)
    text = json.dumps(body, ensure_ascii=True, default=repr)
    headers = {k: v for k, v in (case.headers or {}).items()}
    return f"{case.method} {case.path} headers={headers} body={text[:600]}"


# -- the run ----------------------------------------------------------------------------------


def fuzz(url: str, cases: int, seed_value: int, timeout_s: float) -> Run:
    """Send `cases` cases generated with `seed_value`, shared out by SHARES, to `url`."""
    run = Run(seed_value)
    started = time.monotonic()
    with requests.Session() as session:
        for (operation, mode), (strategy, share) in strategies().items():
            labelled = st.tuples(strategy, st.just(f"{operation} {mode}"))

            @seed(seed_value)
            @settings(
                max_examples=max(1, round(cases * share)),
                deadline=None,
                database=None,
                phases=[Phase.generate],  # failures are counted, never shrunk
                suppress_health_check=list(HealthCheck),
            )
            @given(labelled)
            def each(drawn: tuple[Any, str]) -> None:
                send(session, url, *drawn, run, timeout_s)

            each()
    run.seconds = time.monotonic() - started
    return run


def send(
    session: requests.Session, url: str, case: Any, label: str, run: Run, timeout_s: float
) -> None:
    """Send one case and record its reply in `run`."""
    run.cases[label] += 1
    try:
        kwargs = case.as_transport_kwargs(base_url=url)
        kwargs.pop("cookies", None)
        request = session.prepare_request(requests.Request(**kwargs))
    except (ValueError, TypeError, requests.RequestException):
        run.not_sent += 1
        return
    try:
        reply = session.send(request, timeout=timeout_s)
    except requests.Timeout:
        run.failures.append(Failure("server error", describe(case), "no reply"))
        return
    except requests.ConnectionError as exc:
        run.failures.append(Failure("server error", describe(case), f"closed: {exc}"))
        return
    except (ValueError, requests.RequestException):
        run.not_sent += 1
        return
    content_type = reply.headers.get("content-type", "")
    error = _envelope(content_type, reply.content) if reply.status_code >= 400 else None
    code = error["code"] if error else ""
    mode = label.rpartition(" ")[2]
    run.statuses[f"{mode} {reply.status_code} {code}".strip()] += 1
    if mode == "positive" and reply.status_code == 400 and code in ROUTER_400S:
        run.refused_positive.append(f"{describe(case)}\n    -> {reply.content[:300]!r}")
    kind = judge(reply.status_code, content_type, reply.content)
    if kind is not None:
        detail = f"{reply.status_code} {reply.content[:600]!r}"
        run.failures.append(Failure(kind, describe(case), detail))


def print_run(run: Run, shown: int) -> None:
    s = run.summary()
    print(f"seed {run.seed}: {s['cases']} cases in {run.seconds:.1f} s ({s['cases_per_s']}/s); "
          f"server errors {s['server_errors']}, envelope violations {s['envelope_violations']}, "
          f"not sent {run.not_sent}")  # fmt: skip
    for operation, n in s["by_operation"].items():
        print(f"  {operation}: {n}")
    print("  replies: " + ", ".join(f"{k} x{v}" for k, v in s["statuses"].items()))
    for refused in run.refused_positive[:shown]:
        print(f"  positive case the router refused: {refused}")
    for kind in ("server error", "envelope violation"):
        for failure in [f for f in run.failures if f.kind == kind][:shown]:
            print(f"  {kind}: {failure.case}\n    -> {failure.reply}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000, help="cases per seed (default 3000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per case (default 60)")
    parser.add_argument("--show", type=int, default=5, help="failures shown of each kind")
    parser.add_argument("--json", action="store_true", help="print the totals as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="openapi-fuzz-") as tmp, system(Path(tmp)) as url:
        runs = [fuzz(url, args.cases, s, args.timeout_s) for s in args.seeds]
    if args.json:
        failures = [vars(f) for r in runs for f in r.failures][: args.show * 2]
        out = {"runs": [r.summary() for r in runs], "failures": failures}
        print(json.dumps(out, indent=2))
    else:
        print(f"python -P benchmarks/openapi_fuzz.py --cases {args.cases} "
              f"--seeds {' '.join(map(str, args.seeds))}")  # fmt: skip
        for run in runs:
            print_run(run, args.show)
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
