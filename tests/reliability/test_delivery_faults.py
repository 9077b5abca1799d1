"""Delivery faults in the embedded broker: duplicates, reordering, drops, and all three.

Each scenario drives both kinds through a whole lifecycle (targets, adapters, uploads, an
engine restart, scale-ups, an adapter leaving a deployment's spec, deletions) while the broker
misbehaves, then stops the faults, waits for quiescence (broker idle + resync ticks) and checks
the convergence invariant. Every event is only a nudge: the invariant must hold each time.
"""

from __future__ import annotations

import time

import pytest

from devstack.eventing.broker import Faults
from devstack.stack import Stack
from tests.support import invariant
from tests.support.convergence import Env, Meter, lifecycle, quiesce_and_check, record_result

SCENARIOS = {
    "duplicate": Faults(duplicate=True, seed=11),
    "shuffle": Faults(shuffle=0.5, seed=12),
    "drop10": Faults(drop=0.1, seed=13),
    "all": Faults(duplicate=True, shuffle=0.3, drop=0.1, seed=14),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_invariant_holds_under_delivery_faults(rstack: Stack, name: str) -> None:
    rstack.settle()
    env = Env.new(rstack, f"dl-{name}")
    meter = Meter(rstack)
    started = time.monotonic()
    rstack.broker.set_faults(SCENARIOS[name])
    ops = lifecycle(env)
    time.sleep(1.0)  # let the tail of the lifecycle run under faults too
    figures = meter.figures()
    violations, ticks = quiesce_and_check(rstack, [env.namespace])
    result = {
        **figures,
        "operations": ops,
        "resync_ticks_to_converge": ticks,
        "violations": len(violations),
        "seconds": round(time.monotonic() - started, 1),
    }
    record_result(f"delivery.{name}", result)
    print(f"\ndelivery faults [{name}]: " + ", ".join(f"{k}={v}" for k, v in result.items()))
    assert violations == [], invariant.report(violations)
    if name == "duplicate":
        assert figures["duplicates"] >= figures["events"] // 2
    if name.startswith("drop"):
        assert figures["drops"] > 0
        assert ticks <= 1, f"drops needed {ticks} resync ticks (one period expected)"
