"""driver side of tfonspark."""
