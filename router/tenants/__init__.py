"""Who may call, and how much: API keys (hot-reloaded), rate limits, budgets."""
