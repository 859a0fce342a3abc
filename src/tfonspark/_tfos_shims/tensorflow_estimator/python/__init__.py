"""Package level of tfonspark's ``tensorflow_estimator`` stand-in (see its top-level docstring)."""
