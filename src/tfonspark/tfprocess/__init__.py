"""tfprocess side of tfonspark."""
