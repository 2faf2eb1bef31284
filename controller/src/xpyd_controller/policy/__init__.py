"""Autoscaling policies: observation in, desired pool sizes and reasons out (pure)."""
