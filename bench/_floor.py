"""The cold-start floor of our dependencies (bench/cold_start.py): a functions-framework
function that imports what every step imports (pydantic with a constrained model, httpx with
its transport, prometheus_client), validates one payload and answers 204. What the functions
take beyond this is ours; what this takes beyond bench/_bare.py is the libraries'."""

import ssl

import functions_framework
import httpx
import prometheus_client
from pydantic import BaseModel, Field

ANSWERED = prometheus_client.Counter("floor_answered", "events answered")


class Ref(BaseModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253)
    generation: int = Field(ge=1)


@functions_framework.http
def floor(request):  # type: ignore[no-untyped-def]
    # a client as the functions build theirs (no CA bundle for plain http): imports httpcore
    httpx.Client(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)).close()
    Ref.model_validate({"name": "x", "generation": 1})
    ANSWERED.inc()
    return ("", 204)
