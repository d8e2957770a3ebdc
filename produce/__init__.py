"""The writing side of a topic: the project's idempotent producer (`producer`), the load
generator behind `shmcache produce` (`loadgen`), and the ground truth a produced topic
is checked against (`ground_truth`). Above kafka/ (clients, topics) and consumer/, below
the command line; `shmcache run` never imports it.
"""
