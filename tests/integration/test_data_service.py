"""The tf.data service on real Spark (``tfonspark.data_service``): one service of 2 executor workers.

One service serves every scenario (start-up is the cost): distributed_epoch with two consumers
sharing a job (each element exactly once per epoch, counted), parallel_epochs (each worker the
whole dataset), the sharding policies as TF documents them (FILE/DATA need the dispatcher's
``worker_addresses``, which tfonspark sets), and ``register_dataset``/``from_dataset_id`` read
by two consumers. After the block: no node process, no port accepting.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

import psutil
import pytest

import tfonspark
from tfonspark.errors import ReservationTimeout
from tfonspark.probes import servers_accepting
from tfonspark.tfprocess.data_worker import split_address

from .conftest import node_processes, wait_until

tf = pytest.importorskip("tensorflow")
service = tf.data.experimental.service
N = 40


def _read(ds) -> list[int]:
    return [int(x) for x in ds.as_numpy_iterator()]


def _two_consumers(make) -> list[list[int]]:
    """Read ``make()`` in two threads at once: two consumers of one job."""
    out: list[list[int]] = [[], []]
    threads = [threading.Thread(target=lambda i=i: out[i].extend(_read(make()))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _distributed_epoch(svc) -> None:
    for epoch in range(2):
        name = f"epoch-{epoch}"
        got = _two_consumers(lambda name=name: svc.distribute(tf.data.Dataset.range(N), job_name=name))
        counts = collections.Counter(got[0] + got[1])
        assert counts == collections.Counter(range(N)), (epoch, counts)  # exactly once, across consumers
        print(f"distributed_epoch epoch {epoch}: consumers read {len(got[0])} + {len(got[1])} = {N}, each once")


def _parallel_epochs(svc) -> None:
    got = _read(svc.distribute(tf.data.Dataset.range(N), "parallel_epochs"))
    assert collections.Counter(got) == collections.Counter({i: 2 for i in range(N)})  # each worker: all of it


def _sharding(svc, files: list[str]) -> None:
    policy = service.ShardingPolicy
    rng = tf.data.Dataset.range(N)
    assert sorted(_read(svc.distribute(rng, sharding_policy=policy.OFF))) == sorted(list(range(N)) * 2)
    assert sorted(_read(svc.distribute(rng, sharding_policy=policy.DYNAMIC))) == list(range(N))
    assert sorted(_read(svc.distribute(rng, sharding_policy=policy.DATA))) == list(range(N))
    lines = tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TextLineDataset)
    read = svc.distribute(lines.map(tf.strings.to_number), sharding_policy=policy.FILE)
    assert sorted(int(x) for x in read.as_numpy_iterator()) == list(range(N))  # each file read by one worker


def _shared_dataset_id(svc) -> None:
    ds = tf.data.Dataset.range(N)
    dataset_id = service.register_dataset(svc.target, ds)

    def make():
        return service.from_dataset_id(
            "distributed_epoch", svc.target, dataset_id, element_spec=ds.element_spec, job_name="shared"
        )

    got = _two_consumers(make)
    assert sorted(got[0] + got[1]) == list(range(N))


def test_one_service_of_two_executor_workers(sc, tmp_path):
    files = []
    for i in range(4):  # FILE sharding: 4 files of 10 lines
        path = tmp_path / f"part-{i}.txt"
        path.write_text("".join(f"{j}\n" for j in range(i * 10, i * 10 + 10)))
        files.append(str(path))
    began = time.monotonic()
    with tfonspark.data_service(sc, num_workers=2, reservation_timeout=120) as svc:
        up = time.monotonic()
        assert svc.target.startswith("grpc://") and len(svc.worker_addresses) == 2
        pids = [p.pid for p in node_processes([svc.cluster.cluster_id])]
        _distributed_epoch(svc)
        _parallel_epochs(svc)
        _sharding(svc, files)
        _shared_dataset_id(svc)
        addresses = {"dispatcher": [svc.target.split("://")[1]], "worker": svc.worker_addresses}
        assert all(servers_accepting(addresses, ("dispatcher", "worker")).values())
        read = time.monotonic()
    print(f"data_service: up {up - began:.1f}s, scenarios {read - up:.1f}s, shutdown {time.monotonic() - read:.1f}s")
    assert not any(servers_accepting(addresses, ("dispatcher", "worker")).values())
    assert pids and wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10)
    host, port = split_address(addresses["dispatcher"][0])
    with socket.socket() as probe:  # the dispatcher's port is free again: anyone may bind it
        probe.bind(("", port))


def test_too_few_executors_name_the_numbers_and_settings(sc_local):
    with pytest.raises(ReservationTimeout) as info:
        tfonspark.data_service(sc_local, num_workers=3, reservation_timeout=3)
    message = str(info.value)
    assert "data_service(num_workers=3" in message and "3 Spark task slots" in message, message
    assert "spark.executor.instances" in message, message
    assert (info.value.required, info.value.registered) == (3, 2)
