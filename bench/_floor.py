"""The cold-start floor of our dependencies (bench/cold_start.py): a functions-framework
function that imports the third-party library every step imports (httpx with its transport),
builds a client and answers 204. What the functions take beyond this is ours; what this takes
beyond bench/_bare.py is the library's."""

import ssl

import functions_framework
import httpx


@functions_framework.http
def floor(request):  # type: ignore[no-untyped-def]
    # a client as the functions build theirs (no CA bundle for plain http): imports httpcore
    httpx.Client(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)).close()
    return ("", 204)
