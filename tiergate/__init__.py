"""tiergate: a Kubernetes operator and gateway for tiered LLM inference."""

__version__ = "0.1.0"
