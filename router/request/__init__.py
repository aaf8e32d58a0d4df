"""A request's stages before routing: reading its body, its tier, its cascade."""
