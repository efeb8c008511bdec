"""memfrac: measure what SGLang reserves for non-KV GPU memory against what its workers really use.

Data flows one way: scenario → plan → run → measurement → comparison → store → report/calibration/gate.
"""

__version__ = "0.1.0"
