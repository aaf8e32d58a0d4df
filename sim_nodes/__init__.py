"""Simulated accelerator nodes: catalogs, the performance model, the batching engine and
the OpenAI-compatible node server."""
