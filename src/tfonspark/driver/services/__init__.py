"""Clusters whose nodes only serve (parameter servers, the tf.data service) and the service beside a cluster."""
