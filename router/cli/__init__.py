"""Command-line front ends of the router: `tiergate router`, `tiergate up`, `tiergate demo`."""
