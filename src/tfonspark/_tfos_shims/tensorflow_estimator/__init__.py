"""tfonspark's stand-in for the part of ``tensorflow_estimator`` TFoS examples use.

TensorFlow 2.16 removed ``tf.estimator``; only ``python.estimator.export.export_lib``'s
``get_timestamped_export_dir`` is provided, for TFoS programs run by ``TFCluster.run``.
"""
