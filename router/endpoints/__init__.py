"""What the router knows about its endpoints (their state, the request being routed, a hosted
API's address and key): filled in by discovery and the proxy, read by the policy plugins and
admission."""
