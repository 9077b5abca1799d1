# loraflow functions: one image, one step per Knative Service chosen by FUNCTION_TARGET.
#
# Base: a full version, not a moving tag, so that a rebuild of the same commit gets the same
# interpreter: the one the tests and benchmarks run on (README, Benchmarks). Bump it with them.
# For byte-for-byte reproducible builds pin the digest too (`python:3.11.7-slim-bookworm@sha256:...`,
# as `docker buildx imagetools inspect` prints it): it is not written here because it cannot be
# verified from where this file was written, and a wrong digest only breaks the build.
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    PORT=8080 \
    FUNCTION_SIGNATURE_TYPE=http \
    MALLOC_ARENA_MAX=2

# MALLOC_ARENA_MAX: glibc gives each thread that allocates a malloc arena of its own, which keeps
# what it freed; the threads that list pods and read pages grew a resync's RSS with what they
# read. Two arenas cut its peak at 110,000 adapters from 83 to 78 MiB (bench 8); the interpreter
# lock lets one thread allocate at a time anyway. devstack/functions_host.py starts the
# functions the same way.

WORKDIR /app

# 1. Dependencies, in a layer of their own: it is rebuilt only when pyproject.toml or
#    constraints.txt change, never for a change of code. Only the [project] dependencies
#    (no extras: no kubernetes, no rich), at the versions constraints.txt pins. pip
#    byte-compiles what it installs.
COPY pyproject.toml constraints.txt /tmp/deps/
RUN python -c 'import tomllib; print(*tomllib.load(open("/tmp/deps/pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
        > /tmp/deps/requirements.txt \
    && pip install -c /tmp/deps/constraints.txt -r /tmp/deps/requirements.txt \
    && rm -rf /tmp/deps \
    && groupadd --system --gid 10001 loraflow \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin loraflow

# 2. The code, installed nowhere else: /app is on PYTHONPATH (the project itself is not
#    pip-installed, so no second copy lands in site-packages). compileall because
#    PYTHONDONTWRITEBYTECODE stops the (read-only) runtime from caching .pyc, and every cold
#    start would compile our modules again.
COPY main.py ./
COPY events/ events/
COPY functions/ functions/
RUN python -m compileall -q /app

USER 10001:10001
EXPOSE 8080

# FUNCTION_TARGET (admit, stat, verify, load, reload, unload, resync, ingest, dead_letters) comes
# from each Knative Service's environment, PORT from Knative: the server reads both and serves
# functions-framework's app for that target (functions/edge/server.py says why not its CLI).
CMD ["python", "-m", "functions.edge.server"]
