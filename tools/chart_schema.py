"""Write (or check) the parts of the Helm chart's values.schema.json generated from the code:

    python -P tools/chart_schema.py          # rewrite charts/tiergate/values.schema.json
    python -P tools/chart_schema.py --check  # write nothing; exit 1 when it is stale

- `definitions.tier`: the tier names of sim_nodes/tiers.py; every value that names a tier
  (a tenant's `allowedTiers` and `spillOver`, the alerts' objectives per tier, the tier
  `helm test` asks for) refers to it with `$ref`, so a tier added there needs no other edit;
- `router.policy`: the routing policy's schema (router/policy/schema.py), so a plugin type or
  parameter added there is accepted by helm.

`make docs-reference` runs it, `make docs` runs the check, and tests/chart/test_chart_values.py
fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from tiergate.router.policy.schema import policy_json_schema
from tiergate.sim_nodes.tiers import TIERS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = Path("charts/tiergate/values.schema.json")
#: How a value that names a tier points at the generated list.
TIER_REF = {"$ref": "#/definitions/tier"}


def tier_schema() -> dict[str, Any]:
    """The schema of a value naming a tier: one of the defined tiers."""
    return {
        "type": "string",
        "enum": list(TIERS),
        "description": "A tier (sim_nodes/tiers.py).",
    }


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (the chart's values schema) with its generated parts written anew."""
    out = copy.deepcopy(schema)
    out["definitions"]["tier"] = tier_schema()
    out["properties"]["router"]["properties"]["policy"] = policy_json_schema()
    return out


def text_of(schema: dict[str, Any]) -> str:
    """The file's text: two-space JSON, as committed."""
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    path = args.root / SCHEMA
    current = path.read_text(encoding="utf-8")
    text = text_of(generated(json.loads(current)))
    if text == current:
        return 0
    if args.check:
        print(f"stale (run `make docs-reference`): {path}")
        return 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
