"""Typed models of the Kubernetes resources loraflow reads and writes (pure, no I/O)."""
