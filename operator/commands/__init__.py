"""The operator's CLI commands: `tiergate crds`, `tiergate operator`."""
