from __future__ import annotations
from pathlib import Path
from typing import Any
import pytest
from epp_system import epp_system, post, chat

pytestmark = pytest.mark.slow

def test_smoke(served: Any, tmp_path: Path) -> None:
    with epp_system(served, tmp_path) as system:
        envoy = system.envoy()
        r = post(envoy.url, chat(max_tokens=5))
        print(r.status_code, r.headers, r.text)
        r2 = post(envoy.url, chat(max_tokens=5, stream=True))
        print(r2.status_code, r2.headers, r2.text)
        print(system.rows())
        print(envoy.log_text()[-3000:])
        assert r.status_code == 200
