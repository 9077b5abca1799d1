"""Stand-ins for vLLM and SGLang engine replicas (one HTTP server per 127.0.0.x address).

See ``base.py`` (server, state), ``vllm.py``, ``sglang.py``, ``faults.py``, ``admin.py``
(``/_devstack/`` API) and ``fleet.py`` (address allocation).
"""

from devstack.standins.engines.answers import Response
from devstack.standins.engines.base import EngineReplica, LoadedAdapter, LoadInterval
from devstack.standins.engines.faults import Fault, FaultSpecError
from devstack.standins.engines.fleet import (
    EngineFleet,
    allocate_address,
    release_address,
    reserved_addresses,
)
from devstack.standins.engines.sglang import SglangReplica
from devstack.standins.engines.vllm import VllmReplica

__all__ = [
    "EngineFleet",
    "EngineReplica",
    "Fault",
    "FaultSpecError",
    "LoadInterval",
    "LoadedAdapter",
    "Response",
    "SglangReplica",
    "VllmReplica",
    "allocate_address",
    "release_address",
    "reserved_addresses",
]
