"""Building blocks of ``python -m tfonspark.demo`` (private: the demo's CLI is the interface).

* :mod:`.model`: the demo's CNN, also used by ``examples/mnist`` and ``benchmarks/accuracy.py``;
* :mod:`.data`: images as feature rows, Spark DataFrames and per-node shards;
* :mod:`.feed`: a data feed that can be drained after the last training step;
* :mod:`.progress`: a small authenticated channel that carries progress lines and the final
  result from the TF nodes to the driver's console;
* :mod:`.node`: the ``map_fun`` every TF node runs for the demo.
"""
