"""xpyd controller: capacity model, autoscaling policy, fleet simulator and the live control loop."""

__version__ = "0.1.0"
