"""Imported once by the workers' fork server (consumer/worker/forkserver.py) before it forks
any worker: the worker's modules (numpy, numba, confluent-kafka, the engine) and, on a warm
install, numba's set-up and the decode kernels, so a forked worker starts with all of it
loaded. On a cold install the supervisor's warm-up is still compiling them: each worker then
loads them itself, after the warm-up."""

try:
    from shmcache.consumer import warm
    from shmcache.consumer.worker import forkserver, loop
    from shmcache.ipc import heap, liveness

    liveness.set_process_name(forkserver.NAME)  # what ps and top show of the fork server
    heap.limit_arenas()  # the workers' librdkafka threads: two arenas between them (ipc/heap.py)
    forkserver.die_with_supervisor()
    if warm.is_warm():
        from shmcache.formats import registry

        loop.load_decoders([f for f in registry.FORMATS.values() if f.preload])
    import gc

    gc.freeze()  # what was loaded stays out of the collector's passes: its pages stay shared with the workers
except Exception:  # noqa: BLE001 - a fork server that died here would fail every worker's start
    pass
