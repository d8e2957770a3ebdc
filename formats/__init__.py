"""The contracts on the bytes that travel: what a Kafka message of the txmeta topic is
(`wire`: the v1, v2 and key/value formats, decoded in whole batches by `wire_batch`
over the kernels of `_wire_kernels`; `proto`: the upstream Teranode topic, a protobuf
message per transaction), which partition a key belongs to (`partitioners`), and what a
txmeta value is (`txmeta`: Teranode's MetaBytes).

Used by the consumer (decode) and by the producers and Spark (encode); built on the
engine's public hash and the little-endian loads it reads with (engine/xxh64.py),
and on nothing of Kafka's: no module here imports confluent-kafka.

`registry` holds the formats a topic may hold (`--format`), one entry each, in the order of
the codes the segment and a snapshot keep for them (engine/control/layout.py WIRE_FORMATS,
append only: a code's meaning is for good); every place that takes a format takes it there.
"""
