"""The Spark side of shmcache (PySpark, optional: pip install 'shmcache[spark]')."""
