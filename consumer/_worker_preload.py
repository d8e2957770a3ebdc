"""Imported once by the workers' fork server (consumer/forkserver.py) before it forks any
worker: the worker's modules (numpy, numba, confluent-kafka, the engine) and, on a warm install,
numba's set-up and the decode kernels, so a forked worker starts with all of it loaded."""

try:
    from shmcache.consumer import worker as _worker

    _worker.preload()
except Exception:  # noqa: BLE001 - a fork server that died here would fail every worker's start
    pass
