"""The --tenants file: what it accepts, and every way it can be wrong as one line naming the
file and the field, never the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.bench.errors import BenchError
from tiergate.bench.tenants import BenchTenant, load_tenants

SECRET = "sk-very-secret-0123456789"
ENV = {"HEAVY_KEY": SECRET, "BLANK_KEY": "  ", "SPACED_KEY": "sk two words"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_gives_each_tenant_its_key_and_concurrency(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
tenants:
  - name: heavy
    apiKeyEnv: HEAVY_KEY
    concurrency: 24
  - name: light.team-1
    apiKey: {SECRET}-light
    concurrency: 1
""",
    )
    assert load_tenants(path, ENV) == [
        BenchTenant("heavy", SECRET, 24),
        BenchTenant("light.team-1", f"{SECRET}-light", 1),
    ]
    assert SECRET not in repr(load_tenants(path, ENV))


def test_a_key_from_the_environment_loses_surrounding_whitespace(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants: [{name: a, apiKeyEnv: K, concurrency: 2}]")
    assert load_tenants(path, {"K": f" {SECRET}\n"})[0].api_key == SECRET


def entry(**fields: object) -> str:
    fields = {"name": "heavy", "apiKey": SECRET, "concurrency": 4} | fields
    items = ", ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
    return "{" + items + "}"


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        (f"tenants: [{entry(name='-bad')}]", "tenants[0].name", "should match pattern"),
        (f"tenants: [{entry(name='a b')}]", "tenants[0].name", "should match pattern"),
        (f"tenants: [{entry(concurrency=0)}]", "tenants[0].concurrency", "greater than or equal"),
        (f"tenants: [{entry(concurrency=2.5)}]", "tenants[0].concurrency", "valid integer"),
        (f"tenants: [{entry(concurrency='true')}]", "tenants[0].concurrency", "valid integer"),
        (f"tenants: [{entry(concurrency=None)}]", "tenants[0].concurrency", "Field required"),
        (f"tenants: [{entry(weight=3)}]", "tenants[0].weight", "Extra inputs"),
        (f"tenants: [{entry(apiKeyEnv='HEAVY_KEY')}]", "tenants[0]", "exactly one of apiKey"),
        (f"tenants: [{entry(apiKey=None)}]", "tenants[0]", "exactly one of apiKey"),
        (f"tenants: [{entry(apiKey=None, apiKeyEnv='1X')}]", "tenants[0].apiKeyEnv", "pattern"),
        (
            f"tenants: [{entry(apiKey=f'{SECRET!r}', name='x')}, {entry(apiKey=f'{SECRET!r}')}]",
            "tenants[1].apiKey",
            "the same API key as tenants[0].apiKey",
        ),
        (f"tenants: [{entry()}, {entry(apiKey='other')}]", "tenants[1].name", "duplicate"),
        (f"tenants: [{entry(apiKey=repr(SECRET + ' x'))}]", "tenants[0].apiKey", "whitespace"),
        (f"tenants: [{entry(apiKey=None, apiKeyEnv='UNSET_KEY')}]", "tenants[0].apiKeyEnv",
         "environment variable UNSET_KEY is not set"),
        (f"tenants: [{entry(apiKey=None, apiKeyEnv='BLANK_KEY')}]", "tenants[0].apiKeyEnv",
         "environment variable BLANK_KEY is not set"),
        (f"tenants: [{entry(apiKey=None, apiKeyEnv='SPACED_KEY')}]", "tenants[0].apiKeyEnv",
         "the value of SPACED_KEY must be printable ASCII without whitespace"),
        ("tenants: []", "tenants", "at least 1 item"),
        (f"tenants: [{entry(concurrency=100_001)}]", "tenants[0].concurrency",
         "less than or equal to 100000"),
        (f"tenants: [{entry()}]\nrounds: 3", "rounds", "Extra inputs"),
        ("", "", "expected a mapping with `tenants:`, got an empty file"),
        ("- a\n- b", "", "expected a mapping with `tenants:`, got a list"),
        (f"tenants: [{{name: heavy, apiKey: {SECRET}, concurrency: [}}", "", "(line 1, column"),
        (f"tenants: [{{name: heavy, apiKey: *{SECRET}}}]", "", "not valid YAML (line 1, column"),
        (f"tenants: [{{name: heavy, apiKey: !{SECRET} x}}]", "", "not valid YAML (line 1, column"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line_naming_the_field_never_the_key(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(BenchError) as caught:
        load_tenants(path, ENV)
    message = str(caught.value)
    assert message.startswith(f"--tenants {path}: {field}"), message
    assert problem in message
    assert "\n" not in message and SECRET not in message and "sk-" not in message


def test_a_missing_or_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match=r"^--tenants .*nope\.yaml: no such file$"):
        load_tenants(tmp_path / "nope.yaml", ENV)
    with pytest.raises(BenchError, match=r": cannot read: IsADirectoryError$"):
        load_tenants(tmp_path, ENV)
