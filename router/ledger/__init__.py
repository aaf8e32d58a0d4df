"""What each request cost: the usage ledger, its backlog and retention, the usage API and the
accounting that writes it.
"""
