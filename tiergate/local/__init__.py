"""The whole system on one machine: `tiergate up` (sim nodes of every pool and the router) and
`tiergate demo`; clients of the router, not parts of it."""
