"""The conformance suite's helpers (_readers, _scene) and the golden control areas'
(tests/engine/_golden_control.py) import as top-level modules, as tests/engine's do."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(os.path.dirname(HERE), "engine")):
    if path not in sys.path:
        sys.path.insert(0, path)
