"""Fixtures of the unit tier."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from functions.observability import JsonFormatter


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Capture the `loraflow` logger's output through the production formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("loraflow")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
