"""Write the routing policy's JSON schema (router/policy/schema.py) into the Helm chart's
values.schema.json, at `router.policy`. Run it after adding a plugin type or a parameter:

    python -P tools/policy_schema.py    # rewrite charts/tiergate/values.schema.json

tests/chart/test_chart_values.py fails when the chart's copy is out of date.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tiergate.router.policy.schema import policy_json_schema

SCHEMA = Path(__file__).resolve().parent.parent / "charts" / "tiergate" / "values.schema.json"


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["router"]["properties"]["policy"] = policy_json_schema()
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"{SCHEMA}: router.policy written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
