"""The InferencePool API, `tiergate.dev/v1alpha1`: the one place its schema is written.

`spec` is what one replica runs (`ReplicaSpec`, defined by the sim nodes that read it: the
serving spec the performance model reads - model, accelerator, optional inline profiles of
either, chips, layout, dtypes, batching, speculative decoding, price - plus the names it
answers to and its background load) and what makes it a pool: tier, replicas, the reference
workload its envelope is computed for, SLO targets and pod template overrides. `tiergate
crds` turns these models into the CRD's structural OpenAPI schema (operator/crd.py); a test
fails when the committed YAML differs.

Wire names are camelCase (Kubernetes style); Python names snake_case.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from tiergate.common.tiers import DEFINITIONS, Tier
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import ProfileSource
from tiergate.sim_nodes.replica_spec import ReplicaSpec
from tiergate.sim_nodes.tier_rules import tier_problem

from .autoscaling import AutoscalingSpec, AutoscalingStatus
from .base import Api
from .engines import (
    COMMAND_LINE_FIELDS,
    DEFAULT_ENGINE,
    ENGINES,
    Engine,
    engine_problem,
    option_like_problem,
)
from .hosted import (
    POD_FIELDS,
    SPEC,
    Billing,
    HostedEndpoint,
    SecretKeyRef,
    hosted_url_problem,
    needs_accelerator_problem,
    needs_billing_problem,
    needs_context_problem,
    needs_secret_problem,
    pod_field_problem,
)
from .rollout import RolloutSpec

GROUP = "tiergate.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"


#: Kubernetes object names (RFC 1123 labels: Services are named after their pool).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: A pool's own name names its Deployment and Service, and is a label value: a Service name
#: is a DNS-1035 label (a letter first). The CRD refuses other names (operator/crd.py).
POOL_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: The longest name a label value or a Service may have.
NAME_MAX = 63
#: The most replicas a Deployment and the scale subresource hold (an int32).
MAX_REPLICAS = 2**31 - 1
POOL_NAME_TOO_LONG = (
    f"an InferencePool's name is at most {NAME_MAX} characters (it names its Service)"
)
POOL_NAME_INVALID = (
    "an InferencePool's name must start with a letter and hold only lowercase letters, digits "
    "and '-' (it names its Service: a DNS-1035 label)"
)


def pool_name_problem(name: str) -> str | None:
    """Why `name` cannot name a pool (the CRD's rules in words), or None."""
    if len(name) > NAME_MAX:
        return POOL_NAME_TOO_LONG
    if re.fullmatch(POOL_NAME, name) is None:
        return POOL_NAME_INVALID
    return None


class ReferenceWorkload(Api):
    """The request shape a pool's performance envelope (and so its price) is computed for."""

    input_tokens: int = Field(default=2048, ge=1, description="Prompt tokens per request.")
    cached_input_tokens: int = Field(
        default=0, ge=0, description="Of those, tokens served from the prefix cache."
    )
    output_tokens: int = Field(default=512, ge=1, description="Generated tokens per request.")


class SloSpec(Api):
    """Latency targets for the pool; the envelope is checked against them (condition Ready)."""

    ttft_ms: float | None = Field(default=None, gt=0, description="Time to first token, ms.")
    tpot_ms: float | None = Field(default=None, gt=0, description="Time per output token, ms.")


class Toleration(Api):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key; empty matches all keys.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal)."
    )
    value: str | None = Field(default=None, description="Taint value (with Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


#: A label's value (a node selector's too), as Kubernetes checks it: at most 63 characters,
#: letters and digits first and last, `-`, `_` and `.` between; or empty. (Keys are left to the
#: API server, which refuses a bad one when the operator applies the pods: ApplyRejected.)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: A resource quantity, as Kubernetes reads one (its own pattern): 100m, 2, 1.5Gi, 1e3.
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _checked(pattern: str, max_length: int, what: str) -> tuple[AfterValidator, WithJsonSchema]:
    """A string's check in words (pydantic's own would quote the pattern), and the same
    pattern in the schema, so that the CRD refuses what the models do."""

    def check(value: str) -> str:
        if len(value) > max_length or re.fullmatch(pattern, value) is None:
            raise PydanticCustomError("pattern", f"{value[:80]!r} is not {what}")
        return value

    schema = {"type": "string", "maxLength": max_length, "pattern": pattern}
    return AfterValidator(check), WithJsonSchema(schema)


LabelValue = Annotated[
    str,
    *_checked(
        LABEL_VALUE,
        63,
        "a label value (at most 63 letters, digits, '-', '_' and '.', a letter or digit first "
        "and last)",
    ),
]
Quantity = Annotated[
    str, *_checked(QUANTITY, 64, "a Kubernetes quantity (e.g. 500m, 2, 1.5Gi, 10G)")
]


#: A Secret's name, as Kubernetes checks it (a DNS subdomain).
SECRET_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SecretName = Annotated[
    str,
    *_checked(
        SECRET_NAME,
        253,
        "a Secret's name (at most 253 lowercase letters, digits, '-' and '.', a letter or "
        "digit first and last)",
    ),
]


class PullSecret(Api):
    """A Secret in the pool's namespace, by name (core/v1 LocalObjectReference)."""

    name: SecretName = Field(description="The Secret's name.")


class Resources(Api):
    """Container resources (core/v1 ResourceRequirements); quantities as strings."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="e.g. cpu: 100m.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="e.g. memory: 256Mi.")


class TemplateSpec(Api):
    """Overrides of the pods the operator renders for the pool."""

    image: str | None = Field(
        default=None,
        description=(
            "Container image (default: the operator's own image). The operator runs only its "
            "own image and those on its allow-list; others are refused (ImageNotAllowed)."
        ),
    )
    resources: Resources | None = Field(default=None, description="Container resources.")
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, description="Pod nodeSelector."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations.")
    labels: dict[str, LabelValue] = Field(
        default_factory=dict, description="Extra pod labels (tiergate's own labels win)."
    )
    image_pull_secrets: list[PullSecret] = Field(
        default_factory=list,
        description="Secrets in the pool's namespace to pull its image with (a private "
        "registry or mirror), after those every pool's pods get (the chart's imagePullSecrets).",
    )


class InferencePoolSpec(ReplicaSpec):
    """What a pool serves, on what, how batched, at which tier, and how many replicas.

    A replica's fields (`ReplicaSpec`: the serving spec, names, background load) are defined
    by the sim nodes, which validate the spec they are handed with that same model.
    """

    #: How problems name the spec's fields: an InferencePool's are under `spec.`.
    field_prefix: ClassVar[str] = SPEC

    tier: Tier = Field(
        description="; ".join(f"{d.name}: {d.summary}" for d in DEFINITIONS.values()) + "."
    )
    engine: Engine = Field(
        default=DEFAULT_ENGINE,
        description="What runs the pool's pods: "
        + "; ".join(f"{d.name}: {d.summary}" for d in ENGINES.values())
        + ". vllm and sglang pods run the engine's own command line rendered from this spec "
        "(`tiergate render` prints it) and request nvidia.com/gpu.",
    )
    model_source: str | None = Field(
        default=None,
        min_length=1,
        description="Where a real engine loads the weights from, e.g. a path on the model "
        "cache volume or a Hugging Face repository (default: the catalog model's Hugging Face "
        "id). The performance model still reads spec.model.",
    )
    hugging_face_token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="A Hugging Face token for gated weights, given to the engine as HF_TOKEN.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Serving replicas (scale subresource; at most a Deployment's int32).",
    )
    workload: ReferenceWorkload = Field(
        default_factory=ReferenceWorkload,
        description="Request shape the status envelope (speed, cost) is computed for.",
    )
    slo: SloSpec | None = Field(default=None, description="Latency targets.")
    template: TemplateSpec | None = Field(default=None, description="Pod overrides.")
    rollout: RolloutSpec | None = Field(
        default=None,
        description="How the pods are replaced when what they run changes (the Deployment's "
        "rolling update; default: Kubernetes', 25% surge and 25% unavailable).",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "Replicas that follow the load, sized by the performance model to hold spec.slo. "
            "While set, the operator writes spec.replicas: a manual `kubectl scale` is "
            "overridden at its next decision (with an event)."
        ),
    )

    endpoint: HostedEndpoint | None = Field(
        default=None,
        description="A hosted OpenAI-compatible API that serves the pool instead of pods: "
        "no pods are made, the router sends the provider's key, and tenants pay spec.billing. "
        "Fields that describe pods or hardware are refused beside it.",
    )
    billing: Billing = Field(
        default_factory=Billing,
        description="What tenants pay per token the pool serves (default: the envelope's "
        "predicted cost per output token, prompts free); required for a hosted pool.",
    )

    @model_validator(mode="after")
    def _reads_as_no_option(self) -> InferencePoolSpec:
        """No string the pods' command line carries starts with '-' (engines.py
        `COMMAND_LINE_FIELDS`): the CRD's CEL rules (operator/crd.py) in words."""
        profile = self.model_profile
        given: dict[str, list[str | None]] = {
            "model": [self.model],
            "servedModelName": [self.served_model_name],
            "aliases": list(self.aliases),
            "modelSource": [self.model_source],
            "modelProfile.huggingFaceId": [profile.hugging_face_id if profile else None],
        }
        for field in COMMAND_LINE_FIELDS:
            if any(value is not None and value.startswith("-") for value in given[field]):
                raise PydanticCustomError(
                    "command_line", option_like_problem(field, self.field_prefix)
                )
        return self

    @model_validator(mode="after")
    def _names_its_hardware(self) -> InferencePoolSpec:
        """A pool runs on an accelerator, or is hosted (spec.endpoint) and names none of
        the pods' fields: the CRD's CEL rules (operator/crd.py `hosted_rules`) in words."""
        prefix = self.field_prefix
        if self.endpoint is None:
            if self.accelerator is None:
                raise PydanticCustomError("hosted_rule", needs_accelerator_problem(prefix))
            return self
        fields = type(self).model_fields
        given = {fields[name].alias or name for name in self.model_fields_set}
        for field in POD_FIELDS:
            if field in given:
                raise PydanticCustomError("hosted_rule", pod_field_problem(field, prefix))
        endpoint = self.endpoint
        problem = hosted_url_problem(endpoint.url, prefix)
        if problem is not None:
            raise PydanticCustomError("hosted_rule", problem)
        if self.billing.output_per_million_usd is None:
            raise PydanticCustomError("hosted_rule", needs_billing_problem(prefix))
        if endpoint.max_context_tokens is None and self.model not in default_catalog().models:
            raise PydanticCustomError(
                "hosted_rule", needs_context_problem(default_catalog(), prefix)
            )
        problem = self._hosted_key_problem(endpoint)
        if problem is not None:
            raise PydanticCustomError("hosted_rule", problem)
        return self

    def _hosted_key_problem(self, endpoint: HostedEndpoint) -> str | None:
        """What is wrong with where a hosted pool's key comes from (an InferencePool: a
        Secret; the router's file says a file instead)."""
        return needs_secret_problem() if endpoint.api_key_secret_ref is None else None

    @property
    def hosted(self) -> bool:
        """Whether a provider's API serves the pool (no pods, no performance model)."""
        return self.endpoint is not None

    @model_validator(mode="after")
    def _follows_its_tier(self) -> InferencePoolSpec:
        """The tier's rules (tiergate/common/tiers.py, sim_nodes/tier_rules.py), in the words
        of the CRD's CEL rules, so that a pool file and `kubectl apply` refuse the same pools
        alike. A hosted pool's hardware is the provider's business: no tier rule applies to
        it."""
        if self.accelerator is None:
            return self
        inline = self.accelerator_profile
        problem = tier_problem(
            self.tier,
            self.batching.max_num_seqs,
            self.accelerator,
            inline.memory_kind if inline is not None else None,
            default_catalog(),
        )
        if problem is not None:
            raise PydanticCustomError("tier_rule", problem)
        model = self.model_profile
        speculative = self.speculative_decoding
        problem = engine_problem(
            self.engine,
            accelerator=self.accelerator,
            inline_memory_kind=inline.memory_kind if inline is not None else None,
            model=self.model,
            inline_hugging_face_id=model.hugging_face_id if model is not None else None,
            has_inline_model=model is not None,
            model_source=self.model_source,
            draft_model=speculative.draft_model if speculative is not None else None,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            catalog=default_catalog(),
        )
        if problem is not None:
            raise PydanticCustomError("engine_rule", problem)
        return self


ConditionType = Literal["Ready", "Fits", "Progressing", "Degraded", "Autoscaling"]


class Condition(Api):
    """A Kubernetes API condition."""

    type: ConditionType = Field(description="Ready, Fits, Progressing, Degraded or Autoscaling.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word, for machines.")
    message: str = Field(description="What happened, for people.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="The spec generation the condition is about."
    )


EnvelopeBasis = Literal["predicted", "stated"]


class Envelope(Api):
    """The performance model's prediction for one replica under the reference workload,
    with its batch as full as the batch cap and KV cache allow; for a hosted pool, only the
    price it states (no model predicts someone else's hardware)."""

    basis: EnvelopeBasis = Field(
        default="predicted",
        description="predicted: the performance model's figures for the pool's hardware; "
        "stated: a hosted pool's price as spec.billing states it (no speed is predicted).",
    )
    max_concurrency: int | None = Field(
        default=None, description="Sequences one replica decodes at once."
    )
    tokens_per_second_per_stream: float | None = Field(
        default=None, description="Output tokens/s of one stream."
    )
    throughput_tokens_per_second: float | None = Field(
        default=None, description="Output tokens/s of one replica."
    )
    ttft_seconds: float | None = Field(default=None, description="Time to first token, seconds.")
    cost_per_million_output_tokens_usd: float = Field(
        alias="costPerMillionOutputTokensUSD",
        description="Cost per 1M output tokens: the hardware's (predicted) or the price (stated).",
    )
    cost_per_million_input_tokens_usd: float | None = Field(
        default=None,
        alias="costPerMillionInputTokensUSD",
        description="Stated price per 1M prompt tokens (hosted pools).",
    )
    chips: int | None = Field(default=None, description="Chips per replica.")
    model_source: ProfileSource = Field(
        default="catalog",
        description=(
            "Where the model profile came from: catalog, inline (spec.modelProfile) or "
            "inline-shadows-catalog (spec.modelProfile replaces the catalog entry of that name)."
        ),
    )
    accelerator_source: ProfileSource = Field(
        default="catalog",
        description=(
            "Where the accelerator profile came from: catalog, inline "
            "(spec.acceleratorProfile) or inline-shadows-catalog (it replaces the catalog "
            "entry of that name)."
        ),
    )


class BilledPrice(Api):
    """What the router charges tenants per million tokens the pool serves."""

    basis: EnvelopeBasis = Field(
        description="stated: spec.billing's output price; predicted: no output price is "
        "stated, so tenants pay the envelope's predicted cost."
    )
    output_per_million_usd: float = Field(description="USD per million output tokens.")
    input_per_million_usd: float = Field(
        description="USD per million prompt tokens (spec.billing's; 0 when it states none)."
    )


def billed_price(billing: Billing, envelope: Envelope) -> BilledPrice:
    """What tenants pay for a pool with this `billing` and `envelope` (the router charges the
    same: router/discovery/view.py)."""
    stated = billing.output_per_million_usd
    return BilledPrice(
        basis="predicted" if stated is None else "stated",
        output_per_million_usd=envelope.cost_per_million_output_tokens_usd
        if stated is None
        else stated,
        input_per_million_usd=billing.input_per_million_usd,
    )


class InferencePoolStatus(Api):
    """What the operator observed and predicted."""

    observed_generation: int | None = Field(
        default=None, description="The spec generation last reconciled."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Fits, ...")
    replicas: int | None = Field(default=None, description="Replicas of the Deployment.")
    ready_replicas: int | None = Field(default=None, description="Replicas passing readiness.")
    envelope: Envelope | None = Field(default=None, description="Predicted performance.")
    billed: BilledPrice | None = Field(
        default=None,
        description="What tenants pay: spec.billing's price where it states one, which can "
        "differ from the envelope's predicted cost; else that cost.",
    )
    selector: str | None = Field(default=None, description="Label selector of the pods.")
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="What the autoscaler observed and decided."
    )


class InferencePool(Api):
    """A pool of simulated inference replicas of one tier."""

    api_version: Literal["tiergate.dev/v1alpha1"] = Field(
        default="tiergate.dev/v1alpha1", description="tiergate.dev/v1alpha1"
    )
    kind: Literal["InferencePool"] = Field(default="InferencePool", description="InferencePool")
    metadata: dict[str, object] = Field(default_factory=dict, description="Object metadata.")
    spec: InferencePoolSpec = Field(description="The desired pool.")
    status: InferencePoolStatus | None = Field(default=None, description="Observed state.")
