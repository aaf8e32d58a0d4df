"""What each request cost: the usage ledger (SQLite for one process, PostgreSQL shared), its
backlog, spool and retention.
"""
