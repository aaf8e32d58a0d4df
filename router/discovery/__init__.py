"""Which endpoints serve which pools: from a file or from Kubernetes, with their scraped load and
health.
"""
