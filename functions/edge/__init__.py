"""The shell every step runs in: HTTP in and out, the composition root, message parsing."""
