"""What stands a machine up for a demo or a test, never for production: a local Kafka
broker fetched from Maven Central (`local_kafka`), `shmcache run` as a child process
(`run_process`), and the end-to-end demo with its report (`demo`, `demo_report`).
"""
