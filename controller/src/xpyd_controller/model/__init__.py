"""The xPyD capacity model: pure, vectorised sizing of prefill and decode pools from the seeds."""
