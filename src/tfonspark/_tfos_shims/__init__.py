"""Import-path stand-ins for TFoS programs, put on a TFoS-face TF process's ``PYTHONPATH`` only.

``tensorflow_estimator`` left TensorFlow in 2.16 and no longer imports with it, but every
published TFoS Keras example calls ``export_lib.get_timestamped_export_dir`` from it. Where no
real ``tensorflow_estimator`` is installed, this directory provides that one function (and an
ImportError that says why for anything else). Never on the path of tfonspark's own API.
"""
