"""`tiergate plan`: from traffic and SLOs per tier to the cheapest pools that meet them.

The pipeline, one module each: the plan file (spec) -> each tier's requests (traffic) -> the
configurations the catalog and tier rules allow (space) -> the steady-state prune (screen) ->
confirmation in the virtual-time simulator (confirm), ordered and bounded by the search
(search) -> tables and JSON (report) -> InferencePool manifests (pools).
"""

from .bound import Progress
from .errors import PlanError
from .pools import pool_manifest, write_pools
from .report import Configuration, PlanReport, Prediction, SearchCounts, TierPlan, render
from .search import NO_PROGRESS, plan_fleet, plan_tier
from .spec import PlanFile, SloTarget, TierDemand, load_plan
from .traffic import TierTraffic, plan_traffic

__all__ = [
    "NO_PROGRESS",
    "Configuration",
    "PlanError",
    "PlanFile",
    "PlanReport",
    "Prediction",
    "Progress",
    "SearchCounts",
    "SloTarget",
    "TierDemand",
    "TierPlan",
    "TierTraffic",
    "load_plan",
    "plan_fleet",
    "plan_tier",
    "plan_traffic",
    "pool_manifest",
    "render",
    "write_pools",
]
