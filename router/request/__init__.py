"""The request path's stages and what they share: the exchange and its progress, reading the
body, choosing the tier, spill-over, the cascade (and its tool-call check), relaying the reply
and accounting for it. router/handler.py runs them in order."""
