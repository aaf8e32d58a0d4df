"""The serving node's side: one shared connection pool with retries, relaying a reply, whole or
streamed, and a client that leaves.
"""
