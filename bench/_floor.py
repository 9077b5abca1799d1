"""The cold-start floor of our dependencies (bench/cold_start.py): a functions-framework
function that imports the third-party libraries every step imports (httpx with its transport,
pydantic), builds a client, validates one small model and answers 204. What the functions take
beyond this is ours; what this takes beyond bench/_bare.py is the libraries'."""

import ssl

import functions_framework
import httpx
from pydantic import BaseModel, ConfigDict


class Ref(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, defer_build=True)

    namespace: str
    name: str


@functions_framework.http
def floor(request):  # type: ignore[no-untyped-def]
    # a client as the functions build theirs (no CA bundle for plain http): imports httpcore
    httpx.Client(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)).close()
    Ref.model_validate({"namespace": "a", "name": "b"})  # builds its validator, as a first event does
    return ("", 204)
