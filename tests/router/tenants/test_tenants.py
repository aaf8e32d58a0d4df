"""Tenants: the file (or Secret directory), key hashing, authentication and tier permission."""

import hashlib
import logging
import math
from pathlib import Path

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.tenants.registry import (
    ANONYMOUS,
    TenantConfigError,
    TenantRegistry,
    authorize_tier,
    load_tenants,
    parse_tenants,
)
from tiergate.router.tenants.spill_policy import NO_SPILL, SpillPolicy

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-team-b-fedcba9876543210"
DIGEST_B = hashlib.sha256(KEY_B.encode()).hexdigest()

TENANTS = f"""
tenants:
  - name: team-a
    apiKeys: ["{KEY_A}"]
    allowedTiers: [premium, batched]
    requestsPerMinute: 600
    tokensPerMinute: 200000
    budgetUsd: 50
    budgetPeriod: week
  - name: team-b
    apiKeySha256: ["{DIGEST_B.upper()}"]
"""


@pytest.fixture
def registry(tmp_path: Path) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return load_tenants(path)


def test_file_fields_and_defaults(registry: TenantRegistry) -> None:
    team_a, team_b = registry.tenants["team-a"], registry.tenants["team-b"]
    assert team_a.allowed_tiers == ("batched", "premium")  # TIERS order
    assert (team_a.requests_per_minute, team_a.tokens_per_minute) == (600, 200_000)
    assert (team_a.budget_usd, team_a.budget_period) == (50.0, "week")
    assert team_b.allowed_tiers == ("batched", "premium", "wafer-scale")
    assert team_b.requests_per_minute is None and team_b.tokens_per_minute is None
    assert team_b.budget_usd is None and team_b.budget_period == "month"
    assert registry.authentication_enabled


def test_plaintext_and_hashed_keys_authenticate(registry: TenantRegistry) -> None:
    assert registry.authenticate(f"Bearer {KEY_A}").name == "team-a"
    assert registry.authenticate(f"bearer  {KEY_B} ").name == "team-b"


def test_plaintext_keys_are_not_kept(registry: TenantRegistry) -> None:
    kept = repr(vars(registry)) + repr(list(registry.tenants.values()))
    assert KEY_A not in kept and DIGEST_B.upper() not in kept


def test_secret_directory(tmp_path: Path) -> None:
    # A mounted Secret: tenants.yaml -> ..data/tenants.yaml -> ..2026_01_01/tenants.yaml
    version = tmp_path / "..2026_01_01"
    version.mkdir()
    (version / "tenants.yaml").write_text(TENANTS)
    (tmp_path / "..data").symlink_to(version.name)
    (tmp_path / "tenants.yaml").symlink_to("..data/tenants.yaml")
    assert load_tenants(tmp_path).authenticate(f"Bearer {KEY_A}").name == "team-a"


@pytest.mark.parametrize("header", [None, "", "Basic dXNlcjpwYXNz", "Bearer", "Bearer a b"])
def test_missing_or_malformed_header_is_401(registry: TenantRegistry, header: str | None) -> None:
    with pytest.raises(RouterError) as caught:
        registry.authenticate(header)
    error = caught.value
    assert (error.status, error.type, error.code) == (
        401,
        "authentication_error",
        "missing_api_key",
    )
    assert error.headers["WWW-Authenticate"].startswith("Bearer")


def test_unknown_key_is_401_and_never_echoed(registry: TenantRegistry) -> None:
    wrong = "sk-not-a-key-0000000000"
    with pytest.raises(RouterError) as caught:
        registry.authenticate(f"Bearer {wrong}")
    assert (caught.value.status, caught.value.code) == (401, "invalid_api_key")
    assert wrong not in str(caught.value.envelope())
    with pytest.raises(RouterError):
        registry.authenticate(f"Bearer {KEY_A.upper()}")  # keys are case-sensitive


def test_tier_not_allowed_is_403_naming_allowed_tiers(registry: TenantRegistry) -> None:
    team_a = registry.tenants["team-a"]
    authorize_tier(team_a, "premium")
    with pytest.raises(RouterError) as caught:
        authorize_tier(team_a, "wafer-scale")
    error = caught.value
    assert (error.status, error.type, error.code) == (403, "permission_error", "tier_not_allowed")
    assert "batched, premium" in error.message and "wafer-scale" in error.message


def test_open_mode_serves_everyone_as_anonymous_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tiergate.router"):
        registry = TenantRegistry.open()
        tenant = registry.authenticate(None)
        registry.authenticate("Bearer anything")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "authentication is off: every request is served as tenant anonymous" in (
        warnings[0].getMessage()
    )
    assert tenant is ANONYMOUS and not registry.authentication_enabled
    assert tenant.allowed_tiers == ("batched", "premium", "wafer-scale")
    assert tenant.requests_per_minute is None and tenant.budget_usd is None


def _error(data: object) -> TenantConfigError:
    with pytest.raises(TenantConfigError) as caught:
        parse_tenants(data, source="/etc/tiergate/tenants.yaml")
    assert str(caught.value).startswith("tenants file /etc/tiergate/tenants.yaml: ")
    return caught.value


def test_duplicate_key_across_tenants_names_both() -> None:
    error = _error(
        {
            "tenants": [
                {"name": "a", "apiKeySha256": [DIGEST_B]},
                {"name": "b", "apiKeys": ["sk-x", KEY_B]},
            ]
        }
    )
    assert error.field == "tenants[1].apiKeys[1]"
    assert "tenants[0].apiKeySha256[0]" in str(error) and "'a'" in str(error)
    assert KEY_B not in str(error) and DIGEST_B not in str(error)


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"allowedTiers": ["batched", "fast"]}, "tenants[0].allowedTiers[1]", "wafer-scale"),
        ({"allowedTiers": []}, "tenants[0].allowedTiers", "at least 1"),
        ({"apiKeySha256": ["abc123"]}, "tenants[0].apiKeySha256", "64 hex"),
        ({"apiKeySha256": ["z" * 64]}, "tenants[0].apiKeySha256", "SHA-256"),
        ({"apiKeys": ["sk with space"]}, "tenants[0].apiKeys", "whitespace"),
        ({"requestsPerMinute": 0}, "tenants[0].requestsPerMinute", "greater than 0"),
        ({"budgetUsd": -1}, "tenants[0].budgetUsd", "greater than or equal"),
        ({"budgetPeriod": "year"}, "tenants[0].budgetPeriod", "month"),
        ({"api_keys": ["sk-1"]}, "tenants[0].api_keys", "not permitted"),
        ({"name": "team a"}, "tenants[0].name", "pattern"),
        ({"name": "anonymous"}, "tenants[0].name", "reserved"),
    ],
)
def test_bad_fields_name_the_field(entry: dict[str, object], field: str, words: str) -> None:
    error = _error({"tenants": [{"name": "a", "apiKeys": ["sk-valid-1"]} | entry]})
    assert error.field == field
    assert words in str(error)
    assert "sk with space" not in str(error)


def test_tenant_without_keys_and_duplicate_names() -> None:
    error = _error({"tenants": [{"name": "a"}, {"name": "a", "apiKeys": ["sk-1"]}]})
    assert [field for field, _ in error.problems] == ["tenants[0]", "tenants[1].name"]


def test_empty_or_missing_tenants_list() -> None:
    assert _error({"tenants": []}).field == "tenants"
    assert _error(None).field == ""
    # An empty file or a list: said in the file's terms, not the parser's class names.
    assert "got empty" in str(_error(None)) and "_TenantsFile" not in str(_error(None))
    assert "got a list" in str(_error([{"name": "a"}]))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TenantConfigError, match="no such file"):
        load_tenants(tmp_path / "absent.yaml")
    with pytest.raises(TenantConfigError, match="tenants.yaml: no such file"):
        load_tenants(tmp_path)  # a directory without tenants.yaml
    bad = tmp_path / "bad.yaml"
    bad.write_text(f'tenants:\n  - name: a\n    apiKeys: ["{KEY_A}"\n')
    with pytest.raises(TenantConfigError, match=r"line \d+, column \d+") as caught:
        load_tenants(bad)
    assert KEY_A not in str(caught.value)


@pytest.mark.parametrize("written", ["*{key}", "!{key} x"])
def test_a_key_yaml_reads_as_an_alias_or_a_tag_is_not_quoted_back(
    tmp_path: Path, written: str
) -> None:
    """PyYAML names an alias or tag it cannot resolve in its error: a key written unquoted
    with a leading `*` or `!` would be in the message (and in the reload's log line)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"tenants:\n  - name: a\n    apiKeys: [{written.format(key=KEY_A)}]\n")
    with pytest.raises(TenantConfigError, match=r"not valid YAML \(line 3, column \d+\)") as e:
        load_tenants(bad)
    assert KEY_A not in str(e.value)


# -- weight, maxQueued and spillOver ---------------------------------------------------------


def test_admission_fields_default_to_an_equal_share_no_cap_and_no_spill(
    registry: TenantRegistry,
) -> None:
    team_b = registry.tenants["team-b"]
    assert (team_b.weight, team_b.max_queued, team_b.spill) == (1.0, None, NO_SPILL)
    assert team_b.spill.to == () and team_b.spill.tiers_for(has_tools=False) == ()


def test_admission_fields_as_written() -> None:
    entry = {
        "name": "a",
        "apiKeys": ["sk-valid-1"],
        "weight": 2.5,
        "maxQueued": 64,
        "spillOver": {
            "to": ["wafer-scale", "premium"],
            "maxOutputUsdPerMillion": 25,
            "notForTools": ["wafer-scale"],
        },
    }
    tenant = parse_tenants({"tenants": [entry]}).tenants["a"]
    assert (tenant.weight, tenant.max_queued) == (2.5, 64)
    assert tenant.spill == SpillPolicy(
        to=("premium", "wafer-scale"),  # TIERS order, whatever the file's
        max_output_usd_per_million=25.0,
        not_for_tools=("wafer-scale",),
    )
    assert tenant.spill.tiers_for(has_tools=True) == ("premium",)
    assert tenant.spill.tiers_for(has_tools=False) == ("premium", "wafer-scale")


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"weight": 0}, "tenants[1].weight", "greater than 0"),
        ({"weight": -2}, "tenants[1].weight", "greater than 0"),
        ({"weight": math.nan}, "tenants[1].weight", "finite"),
        ({"weight": math.inf}, "tenants[1].weight", "finite"),
        ({"weight": "heavy"}, "tenants[1].weight", "valid number"),
        ({"maxQueued": 0}, "tenants[1].maxQueued", "greater than 0"),
        ({"maxQueued": 2.5}, "tenants[1].maxQueued", "valid integer"),
        ({"spillOver": {"to": ["premium"], "later": 1}}, "tenants[1].spillOver.later",
         "not permitted"),
        ({"spillOver": {"to": ["premium"], "max_output_usd_per_million": 1}},
         "tenants[1].spillOver.max_output_usd_per_million", "not permitted"),
        ({"spillOver": {"to": ["fast"]}}, "tenants[1].spillOver.to[0]", "wafer-scale"),
        ({"spillOver": {"to": []}}, "tenants[1].spillOver.to", "at least 1"),
        ({"spillOver": {}}, "tenants[1].spillOver.to", "required"),
        ({"spillOver": {"to": "premium"}}, "tenants[1].spillOver.to", "valid list"),
        ({"spillOver": {"to": ["premium"], "notForTools": ["fast"]}},
         "tenants[1].spillOver.notForTools[0]", "wafer-scale"),
        ({"spillOver": {"to": ["premium"], "maxOutputUsdPerMillion": -1}},
         "tenants[1].spillOver.maxOutputUsdPerMillion", "greater than or equal to 0"),
        ({"spillOver": {"to": ["premium"], "maxOutputUsdPerMillion": math.nan}},
         "tenants[1].spillOver.maxOutputUsdPerMillion", "finite"),
        ({"allowedTiers": ["batched"], "spillOver": {"to": ["premium"]}},
         "tenants[1].spillOver.to", "'premium' is not in allowedTiers"),
    ],
)  # fmt: skip
def test_bad_admission_fields_are_one_problem_naming_the_field(
    entry: dict[str, object], field: str, words: str
) -> None:
    good = {"name": "first", "apiKeys": ["sk-valid-0"]}
    error = _error({"tenants": [good, {"name": "a", "apiKeys": ["sk-valid-1"]} | entry]})
    assert len(error.problems) == 1, error.problems
    assert error.field == field
    assert words in str(error)


def test_a_spill_tier_not_allowed_is_named_once_per_tier() -> None:
    entry = {"name": "a", "apiKeys": ["sk-1"], "allowedTiers": ["batched"],
             "spillOver": {"to": ["wafer-scale", "premium"]}}  # fmt: skip
    error = _error({"tenants": [entry]})
    assert error.problems == [
        ("tenants[0].spillOver.to", "tier 'premium' is not in allowedTiers"),
        ("tenants[0].spillOver.to", "tier 'wafer-scale' is not in allowedTiers"),
    ]
