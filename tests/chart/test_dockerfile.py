"""The Dockerfile, checked statically: docker cannot run here, so these are its promises on paper.

What is checked: a pinned Python 3.11 slim base, a numeric non-root USER equal to the chart's,
`ENTRYPOINT ["tiergate"]`, the environment a read-only root filesystem needs, and a build
context that holds every package the distribution declares.
"""

from __future__ import annotations

import json
import re
import tomllib

import yaml
from chart_helpers import CHART, REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    parsed = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            parsed.append((keyword.upper(), rest.strip()))
    return parsed


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_every_base_image_is_a_pinned_python_3_11_slim() -> None:
    args = {}
    for keyword, rest in instructions():
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
    bases = [rest.split()[0] for keyword, rest in instructions() if keyword == "FROM"]
    assert bases
    for base in bases:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        # An exact patch release and Debian release, never a moving tag like 3.11-slim.
        assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", image), image


def test_runs_as_the_numeric_non_root_user_the_chart_expects() -> None:
    users = [rest for keyword, rest in final_stage() if keyword == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["runAsUser"] == int(uid)


def test_entrypoint_is_the_tiergate_command_in_exec_form() -> None:
    entrypoints = [rest for keyword, rest in final_stage() if keyword == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["tiergate"]]


def test_environment_writes_nothing_to_the_root_filesystem() -> None:
    env = {}
    for keyword, rest in final_stage():
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"


def test_installs_the_project_without_extras() -> None:
    installs = [
        rest for keyword, rest in instructions() if keyword == "RUN" and "pip install" in rest
    ]
    assert installs and all(re.search(r"pip install \.(\s|$)", rest) for rest in installs)
    assert not any("[" in rest for rest in installs)  # no .[dev] or other extras


def test_build_context_holds_every_package_folder() -> None:
    """A new top-level package must be copied (and let through .dockerignore) too."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = set(config["tool"]["setuptools"]["package-dir"].values())
    needed = folders | {"pyproject.toml", config["project"]["readme"]}
    copied = set()
    for keyword, rest in instructions():
        if keyword == "COPY" and "--from" not in rest:
            copied.update(source.rstrip("/") for source in rest.split()[:-1])
    assert copied == needed
    allowed = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert needed <= allowed
