"""shmcache's test helpers, one package (tests/lib/pyproject.toml; scripts/setup installs it):
real supervisors and their harness (`supervisors`), a topic's model (`topic_model`), waits on
conditions (`waits`), pods (`pods`), brokers (`private_broker`, `kafka_gate`), the engine's child
processes (`procs`, `fuzz_child`, `atomics_child`), the goldens' writers (`golden_segments`,
`golden_cases`, `golden_control`, `golden_snapshots`, `golden_txmeta`), the conformance suite's
readers and scenes (`readers`, `scene`), the session's fixtures (`fixtures`), the fault suite
(`faults`) and the benchmarks' helpers (`bench`)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the repository: tests/lib/shmtest/ is three below it
