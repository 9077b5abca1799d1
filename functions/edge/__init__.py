"""The shell every step runs in: `shell` (HTTP in, one outcome out), `messages` (CloudEvents on
the wire), `inputs` (what an event points at, checked before any I/O), `bootstrap` (the
composition root)."""
