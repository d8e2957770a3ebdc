"""`shmcache run`: a topic into the table. The supervisor (this machine's only member of
the consumer group) and its worker processes (fetch, decode, apply in partition order),
their settings (config.py) and the warm-up of the kernels they use."""
