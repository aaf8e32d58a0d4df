"""Write the routing policy's JSON schema (router/policy/schema.py) into the Helm chart's
values.schema.json, at `router.policy`. Run it after adding a plugin type or a parameter:

    python -P tools/policy_schema.py           # rewrite charts/tiergate/values.schema.json
    python -P tools/policy_schema.py --check   # exit 1 if the chart's copy is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tiergate.router.policy.schema import policy_json_schema

SCHEMA = Path(__file__).resolve().parent.parent / "charts" / "tiergate" / "values.schema.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args()
    schema = json.loads(SCHEMA.read_text())
    current = schema["properties"]["router"]["properties"].get("policy")
    wanted = policy_json_schema()
    if args.check:
        if current != wanted:
            print(f"{SCHEMA}: router.policy is out of date; run python -P {__file__}")
            return 1
        return 0
    schema["properties"]["router"]["properties"]["policy"] = wanted
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"{SCHEMA}: router.policy written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
