"""A worker process of `shmcache run`: fetch its assigned partitions, decode, apply in order,
publish the offsets it applied.

    loop.py           the Worker: its loop, the supervisor's commands, the process's entry point
    profile.py        where its time goes, logged at exit
    log_replaced.py   a partition's log replaced under it (a topic re-created) or cut by retention
    lock_wait.py      a write waiting for a bucket lock a live process holds
    forkserver.py     where worker processes come from, and _preload.py, what it imports first

A folder because a worker is one process with these parts. It knows nothing of the
supervisor's modules (tests/test_layers.py holds it to that): the pipe's commands and the
control area's rows are all they share.
"""
