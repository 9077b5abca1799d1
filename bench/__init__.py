"""loraflow benchmarks: each reports medians and a ratio against a reference run alongside."""
