"""`shmcache run`: a topic into the table. The supervisor (consumer/supervisor/: this
machine's only member of the consumer group, and the policy over its workers) and its
worker processes (consumer/worker/: fetch, decode, apply in partition order), with what
both take: their settings (config.py, one RunConfig from flags or TOML) and the warm-up of
the kernels they use (warm.py)."""
