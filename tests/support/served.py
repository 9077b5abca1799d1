"""Functions that show how the container's server runs the functions-framework app
(tests/functions/test_server.py): how many requests it serves at once, and what it does with one
in flight when it is told to stop, and how its cycle collector is tuned."""

from __future__ import annotations

import gc
import threading
import time

import flask
import functions_framework

TOGETHER = 8
"""Requests `together` waits for: functions-framework's 4 threads per CPU on two CPUs."""

_gate = threading.Barrier(TOGETHER, timeout=20)


@functions_framework.http
def together(request: flask.Request) -> tuple[str, int]:
    """Answers a POST only once TOGETHER of them are inside the app at the same time."""
    if request.method == "GET":
        return "ok\n", 200  # the probe
    _gate.wait()
    return "", 204


@functions_framework.http
def slow(request: flask.Request) -> tuple[str, int]:
    """Answers after ?s= seconds."""
    if request.path == "/healthz":
        return "ok\n", 200  # the probe
    time.sleep(float(request.args.get("s", "1")))
    return "done\n", 200


@functions_framework.http
def collector(request: flask.Request) -> dict[str, object]:
    """The worker's cycle collector as a request finds it: thresholds, and objects frozen."""
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}
