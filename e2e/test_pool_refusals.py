"""Pools the operator or the API server refuses, and what each says: kubectl's message, the
pool's conditions and events; nothing of another app's taken, nothing half rolled out."""

from __future__ import annotations

import pytest
from release import Release
from test_pools import EXAMPLES, POOLS, chat, served_by

pytestmark = pytest.mark.usefixtures("pools_removed")


@pytest.fixture(scope="module")
def release(module_release: Release) -> Release:
    """One release for the module: each test makes pools of its own names."""
    return module_release


INVALID_PREMIUM = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: too-wide}
spec: {tier: premium, model: frontier, accelerator: b200, chips: 8, batching: {maxNumSeqs: 64}}
"""

NOT_FITTING = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: too-small}
spec: {tier: batched, model: frontier, accelerator: h100-sxm, chips: 1, weightDtype: bf16}
"""


def test_a_pool_whose_model_does_not_fit_gets_fits_false_and_no_deployment(
    release: Release,
) -> None:
    release.kubectl("apply", "-f", "-", input=NOT_FITTING)
    release.wait(
        lambda: (release.condition("too-small", "Fits") or {}).get("status") == "False",
        "too-small Fits=False",
    )
    fits = release.condition("too-small", "Fits") or {}
    assert fits.get("reason") == "ModelDoesNotFit", fits
    # The numbers a person needs: what the weights need, what the chip offers.
    assert "h100-sxm" in fits.get("message", "") and " GB" in fits.get("message", ""), fits
    assert not release.exists("deployment", "too-small")


TAKEN_NAME = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: billing}
spec: {tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, chips: 1}
"""

BAD_LABEL_KEY = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: bad-label}
spec:
  tier: batched
  model: llama-3.1-8b
  accelerator: h100-sxm
  chips: 1
  template: {labels: {"team a": x}}
"""


def event_reasons(release: Release, name: str, kind: str = "Warning") -> list[str]:
    """Reasons of the events of type `kind` (Warning, Normal) about the object `name`."""
    out = release.kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={name},type={kind}",
        "-o", "jsonpath={.items[*].reason}",
    )  # fmt: skip
    return out.split()


def warning_reasons(release: Release, name: str) -> list[str]:
    return event_reasons(release, name, "Warning")


def test_the_operator_takes_no_other_apps_object_and_says_what_it_could_not_apply(
    release: Release,
) -> None:
    # Another app's Service has the name a pool wants.
    release.kubectl("create", "service", "clusterip", "billing", "--tcp=80:8080")
    release.kubectl("apply", "-f", "-", input=TAKEN_NAME)
    release.wait(
        lambda: (release.condition("billing", "Ready") or {}).get("reason") == "NameTaken",
        "billing Ready=False NameTaken",
    )
    ready = release.condition("billing", "Ready") or {}
    assert "Service " in ready["message"] and "already exists" in ready["message"], ready
    release.wait(lambda: "NameTaken" in warning_reasons(release, "billing"), "a NameTaken event")
    assert not release.exists("deployment", "billing")  # nothing applied, not even that
    service = release.get("service", "billing")
    assert not service["metadata"].get("ownerReferences"), service["metadata"]
    assert service["spec"]["selector"] == {"app": "billing"}
    release.kubectl("delete", "inferencepool.tiergate.dev", "billing", "--wait=true")
    assert release.exists("service", "billing")  # deleting the pool took nothing of the app's
    release.kubectl("delete", "service", "billing")

    # A pod label key the CRD lets through and the API server refuses on the Deployment.
    release.kubectl("apply", "-f", "-", input=BAD_LABEL_KEY)
    release.wait(
        lambda: (
            (release.condition("bad-label", "Progressing") or {}).get("reason") == "ApplyRejected"
        ),
        "bad-label Progressing=False ApplyRejected",
    )
    progressing = release.condition("bad-label", "Progressing") or {}
    assert "team a" in progressing["message"], progressing
    assert "ApplyRejected" in warning_reasons(release, "bad-label")
    release.kubectl("delete", "inferencepool.tiergate.dev", "bad-label", "--wait=true")


def test_a_refused_edit_leaves_the_previous_pods_serving_and_says_so(release: Release) -> None:
    """A batch cap below the pool's background load, then an image the operator does not
    allow: neither is rolled out, the previous pods keep serving through the router, and the
    conditions say both (Ready=True about the previous generation, Progressing why not)."""
    release.kubectl("apply", "-f", str(EXAMPLES / "wafer-scale.yaml"))
    release.wait(lambda: served_by(release, "wafer-scale"), "the router to serve wafer-scale")
    pool = POOLS["wafer-scale"]
    before = release.get("deployment", pool)
    served_generation = release.get("inferencepool.tiergate.dev", pool)["metadata"]["generation"]
    for patch, reason, words in (
        ('{"spec": {"batching": {"maxNumSeqs": 4}}}', "InvalidSpec", "no batch slot"),
        ('{"spec": {"batching": {"maxNumSeqs": 8}, "template": {"image": "evil/miner:1"}}}',
         "ImageNotAllowed", "evil/miner:1 is not allowed"),
    ):  # fmt: skip
        release.kubectl("patch", "inferencepool.tiergate.dev", pool, "--type=merge", "-p", patch)
        release.wait(
            lambda r=reason: (release.condition(pool, "Progressing") or {}).get("reason") == r,
            f"{pool} Progressing=False {reason}",
        )
        ready = release.condition(pool, "Ready") or {}
        assert (ready.get("status"), ready.get("reason")) == ("True", "ServingPreviousSpec"), ready
        assert ready.get("observedGeneration") == served_generation, ready
        assert words in (release.condition(pool, "Progressing") or {})["message"]
        release.wait(lambda r=reason: r in warning_reasons(release, pool), f"a {reason} event")
        assert chat(release, "wafer-scale").status_code == 200  # still routed, still served
    after = release.get("deployment", pool)
    assert after["spec"]["template"] == before["spec"]["template"]  # nothing rolled out
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_an_invalid_pool_is_refused_with_a_readable_message(release: Release) -> None:
    done = release.apply(INVALID_PREMIUM)
    assert done.returncode != 0
    assert "maxNumSeqs" in done.stderr and "16" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not release.exists("inferencepool.tiergate.dev", "too-wide")
    # A name that cannot name its Service is refused by the API server too (CEL on the name).
    done = release.apply(INVALID_PREMIUM.replace("too-wide", "1-too-wide").replace("64", "8"))
    assert done.returncode != 0 and "start with a letter" in done.stderr, done.stderr
