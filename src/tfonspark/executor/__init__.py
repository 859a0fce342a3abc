"""executor side of tfonspark."""
