"""What every part of the router shares and that imports none of them: the error type and its
envelope, raw ASGI types and helpers, JSON bytes, tiers and their resolution, background loops
and the metric events the stages report."""
