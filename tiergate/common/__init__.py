"""What every part of tiergate stands on and that imports none of them: the tiers, the
command-line toolkit, validation messages, a pod IP as a URL host, and the connection limits
and JSON nesting bound that the router and the sim nodes both serve with."""
