"""A bare functions-framework function: the cold-start reference (bench/cold_start.py)."""

import functions_framework


@functions_framework.http
def bare(request):  # type: ignore[no-untyped-def]
    return ("", 204)
