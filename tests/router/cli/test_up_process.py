"""`tiergate up` as a user runs it: a real process tree that must not outlive its parent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from loopback_ports import free_port

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

CONFIG = """
router: {{ledgerPath: {ledger}}}
pools:
  - {{name: tiny, tier: batched, model: llama-3.1-8b, accelerator: wse-3,
      batching: {{maxNumSeqs: 4}}, replicas: 1}}
"""


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


TENANTS = """
tenants:
  - {name: alice, apiKeys: [alice-key-0123456789], allowedTiers: [batched]}
  - {name: bob, apiKeys: [bob-key-0123456789], allowedTiers: [batched],
     budgetUsd: 0.000000001, budgetPeriod: total}
"""


def start_up(config: Path, router_port: int, node_port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-P", "-m", "tiergate", "up", "--config", str(config),
            "--port", str(router_port), "--metrics-port", "0",
            "--first-node-port", str(node_port)]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        assert up.poll() is None, "tiergate up exited early"
        assert time.monotonic() < deadline, "tiergate up did not become ready"
        try:
            if httpx.get(f"http://127.0.0.1:{router_port}/readyz").status_code == 200:
                return up
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def stop(up: subprocess.Popen[bytes], node_port: int, sig: signal.Signals) -> None:
    """Send `sig` to `tiergate up` and wait until it and its sim node are gone."""
    os.kill(up.pid, sig)
    up.wait(timeout=20)
    deadline = time.monotonic() + 15
    while listening(node_port):
        assert time.monotonic() < deadline, f"the sim node outlived tiergate up ({sig.name})"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_up_stops_its_nodes(tmp_path: Path, sig: signal.Signals) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(CONFIG.format(ledger=tmp_path / "ledger.sqlite"))
    router_port, node_port = free_port(), free_port()
    up = start_up(config, router_port, node_port)
    try:
        assert listening(node_port)
        stop(up, node_port, sig)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_a_router_killed_right_after_replying_has_billed_every_reply(tmp_path: Path) -> None:
    """SIGKILL the moment the last reply is in: every reply the clients got is in the ledger
    after a restart (whole replies and streams alike), and a spent budget stays spent."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    config = tmp_path / "up.yaml"
    config.write_text(
        CONFIG.format(ledger=tmp_path / "ledger.sqlite").replace(
            "router: {", f"router: {{tenantsFile: {tenants}, "
        )
    )
    router_port, node_port = free_port(), free_port()
    url = f"http://127.0.0.1:{router_port}/v1/chat/completions"
    alice = {"authorization": "Bearer alice-key-0123456789"}
    bob = {"authorization": "Bearer bob-key-0123456789"}
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}  # fmt: skip
    up = start_up(config, router_port, node_port)
    try:
        billed = 0.0
        for i in range(6):
            if i % 2:
                r = httpx.post(url, json=body, headers=alice, timeout=30)
                assert r.status_code == 200, r.text
                billed += float(r.headers["x-tiergate-cost-usd"])
            else:
                stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
                with httpx.stream("POST", url, json=stream, headers=alice, timeout=30) as s:
                    assert s.status_code == 200
                    events = [x[6:] for x in s.iter_lines() if x.startswith("data: ")]
                assert events[-1] == "[DONE]"
                billed += json.loads(events[-2])["usage"]["cost_usd"]
        r = httpx.post(url, json=body, headers=bob, timeout=30)
        assert r.status_code == 200, r.text  # bob's first request spends his whole budget
        stop(up, node_port, signal.SIGKILL)  # the node's port is needed again

        up = start_up(config, router_port, node_port)
        usage = httpx.get(url.replace("chat/completions", "usage"), headers=alice).json()
        assert usage["totals"]["requests"] == 6
        assert usage["totals"]["cost_usd"] == pytest.approx(billed, abs=1e-6)
        refused = httpx.post(url, json=body, headers=bob, timeout=30)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "budget_exceeded"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_s_nodes_honour_the_fault_header_when_the_router_forwards_it(tmp_path: Path) -> None:
    """Sim nodes ignore x-tiergate-fault unless started with --enable-fault-injection: `up`
    starts them so when its router forwards the header (a local fault drill)."""
    config = tmp_path / "up.yaml"
    config.write_text(
        CONFIG.format(ledger=tmp_path / "ledger.sqlite").replace(
            "router: {", "router: {forwardFaultHeader: true, "
        )
    )
    router_port, node_port = free_port(), free_port()
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}  # fmt: skip
    up = start_up(config, router_port, node_port)
    try:
        r = httpx.post(f"http://127.0.0.1:{router_port}/v1/chat/completions", json=body,
                       headers={"x-tiergate-fault": "418"}, timeout=30)  # fmt: skip
        assert r.status_code == 418, r.text
        assert r.json()["error"]["code"] == "injected_fault"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def run_up(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-P", "-m", "tiergate", "up", "--config", str(config), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_ports_in_use_or_out_of_range_are_one_line_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(CONFIG.format(ledger=tmp_path / "ledger.sqlite"))
    with socket.socket() as held:  # something else already listens on the node's port
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        router_port = free_port()
        done = run_up(config, "--port", str(router_port), "--metrics-port", "0",
                      "--first-node-port", str(taken))  # fmt: skip
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert f"cannot listen on 127.0.0.1:{taken}" in done.stderr
        assert not listening(router_port)  # the router never started
        done = run_up(config, "--port", str(taken), "--first-node-port", str(free_port()))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert f"cannot listen on 127.0.0.1:{taken}" in done.stderr
        done = run_up(config, "--port", str(router_port), "--metrics-port", str(taken),
                      "--first-node-port", str(free_port()))  # fmt: skip
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        metrics_taken = "the metrics port (router.metricsPort, --metrics-port): cannot listen on"
        assert f"{metrics_taken} 127.0.0.1:{taken}" in done.stderr
        assert not listening(router_port)
    two = tmp_path / "two.yaml"  # two nodes from 65535 would need port 65536
    two.write_text(
        CONFIG.format(ledger=tmp_path / "ledger.sqlite").replace("replicas: 1", "replicas: 2")
    )
    for path, flags in [(config, ["--port", "70000"]), (config, ["--first-node-port", "-1"]),
                        (two, ["--first-node-port", "65535"])]:  # fmt: skip
        done = run_up(path, *flags)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "65535" in done.stderr.strip().splitlines()[-1]


def node_pid(port: int) -> int | None:
    """The pid of the sim node started for `port` (its command line names the port)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sim-node" in argv and str(port).encode() in argv:
            return int(entry.name)
    return None  # none, or a zombie (its command line is gone)


def test_a_node_that_dies_while_up_runs_is_restarted(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(CONFIG.format(ledger=tmp_path / "ledger.sqlite"))
    router_port, node_port = free_port(), free_port()
    up = start_up(config, router_port, node_port)
    try:
        first = node_pid(node_port)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:  # restarted after ~1 s: a new process on the same port
            assert up.poll() is None, "tiergate up exited when its node died"
            assert time.monotonic() < deadline, "the node was not restarted"
            now = node_pid(node_port)
            if now is not None and now != first and listening(node_port):
                break
            time.sleep(0.1)
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}  # fmt: skip
        url = f"http://127.0.0.1:{router_port}/v1/chat/completions"
        replies = [httpx.post(url, json=body, timeout=30).status_code for _ in range(3)]
        assert replies[-1] == 200, replies
    finally:
        stop(up, node_port, signal.SIGTERM)


def test_a_router_killed_mid_stream_has_billed_what_it_relayed(tmp_path: Path) -> None:
    """SIGKILL while streams are relaying tokens: each stream's row was written at its first
    token and amended as it went, so the ledger bills every stream for its prompt as the node
    counted it and for all the tokens its client had received up to about one bill interval
    before the kill. The node decodes speculatively (a chunk carries several tokens) and its
    filler text is a word a token, so the clients count tokens, not chunks."""
    config = tmp_path / "up.yaml"
    ledger = tmp_path / "ledger.sqlite"
    speculative = (
        "speculativeDecoding: {draftModel: llama-3.2-1b, tokens: 4, acceptanceRate: 0.8},"
        " billing: {inputPerMillionUsd: 2, outputPerMillionUsd: 10},"
    )
    config.write_text(
        CONFIG.format(ledger=ledger)
        .replace("wse-3", "h100-sxm")
        .replace("batching:", speculative + "\n      batching:")
    )
    router_port, node_port = free_port(), free_port()
    url = f"http://127.0.0.1:{router_port}/v1/chat/completions"
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi! " * 200}],
            "max_tokens": 20_000, "stream": True}  # fmt: skip
    #: (when, tokens so far) at each content chunk of each stream.
    received: list[list[tuple[float, int]]] = [[] for _ in range(3)]

    def read(got: list[tuple[float, int]]) -> None:
        tokens = 0
        try:
            with httpx.stream("POST", url, json=body, timeout=60) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        tokens += len(
                            json.loads(line[6:])["choices"][0]["delta"]["content"].split()
                        )
                        got.append((time.monotonic(), tokens))
        except httpx.HTTPError:
            pass  # the router is gone

    up = start_up(config, router_port, node_port)
    try:
        whole = {**body, "max_tokens": 1, "stream": False}
        prompt_tokens = httpx.post(url, json=whole, timeout=60).json()["usage"]["prompt_tokens"]
        readers = [threading.Thread(target=read, args=(got,)) for got in received]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 60
        while not all(got and got[-1][0] - got[0][0] > 5 for got in received):
            assert time.monotonic() < deadline, "the streams did not run for 5 s"
            time.sleep(0.05)
        killed_s = time.monotonic()
        stop(up, node_port, signal.SIGKILL)
        for reader in readers:
            reader.join(30)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        rows = db.execute(
            "SELECT outcome, prompt_tokens, completion_tokens, cost_usd FROM usage"
            " WHERE outcome != 'ok'"
        ).fetchall()
        (total_usd,) = db.execute("SELECT SUM(cost_usd) FROM tenant_daily").fetchone()
    assert len(rows) == 3, rows
    # What a client had a bill interval (1 s) before the router stopped relaying (killed, or
    # stalled before that), with a second's room for a loaded machine.
    had = sorted(
        max((n for t, n in got if t < min(killed_s, got[-1][0]) - 2), default=0) for got in received
    )
    got_all = sorted(got[-1][1] for got in received)
    chunks = sorted(len(got) for got in received)
    billed = sorted(row[2] for row in rows)
    assert all(row[0] == "incomplete" and row[1] == prompt_tokens for row in rows), rows
    assert all(b >= h > 0 for b, h in zip(billed, had, strict=True)), (billed, had)
    assert all(b <= g for b, g in zip(billed, got_all, strict=True)), (billed, got_all)
    assert all(g > 1.5 * c for g, c in zip(got_all, chunks, strict=True))  # several a chunk
    assert all(row[3] == pytest.approx((2 * row[1] + 10 * row[2]) / 1e6) for row in rows)
    assert total_usd == pytest.approx(sum(row[3] for row in rows) + 2 * prompt_tokens / 1e6 + 1e-5)
