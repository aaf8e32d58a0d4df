"""The serving node's side: one shared connection pool with retries, reading a stream's events,
and a client that leaves.
"""
