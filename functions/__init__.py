"""loraflow functions: one CloudEvent step per module (see docs/contracts.md)."""
