"""`aisimulate_core._native`, imported only to validate an explicit AIS perf-model spec (unused here)."""

from aisimulate_core.sdk import RustForwardPassPerfModel

__all__ = ["RustForwardPassPerfModel"]
