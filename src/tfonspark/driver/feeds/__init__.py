"""Feeding Spark data to a running cluster: feed jobs, their pacing watch, streams, restartable epochs."""
