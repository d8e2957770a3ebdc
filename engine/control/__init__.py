"""The control area: the segment's words that say how a cache is being kept filled from
Kafka (topic, supervisor, workers, partitions, broker, group, snapshots), beside the
table in the same segment.

    layout.py   the words: header words H_*, a row per worker K_*, a row per partition P_*
    area.py     ControlView (every handle's `control`: the words read) and ControlArea (a
                Writer's: the view plus named writes, one per fact the supervisor publishes)
    rows.py     the worker and partition rows' writes, through their owners
    status.py   status() and wait_ready(), assembled from the view; the readiness rule
    bound.py    the readiness bound (max lag, max behind): its words and its grammar

A folder of its own, inside engine/: the table's handles build the view (a Reader's
`status()`, `wait_ready()` and `control` are public), so it sits below them, and it reads
nothing of the engine but engine/layout.py (tests/test_layers.py holds it to that). Nothing
outside this folder writes a control word but through ControlArea's named methods and the
rows': there is no write of a word by its index.
"""
