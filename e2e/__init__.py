"""End-to-end tests and the local-cluster harness (kwok / kind / existing), importable by the demo."""
