# loraflow functions: one image, one step per Knative Service chosen by FUNCTION_TARGET.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=8080 \
    FUNCTION_SIGNATURE_TYPE=http

WORKDIR /app

# Dependencies first (cached layer): pinned by constraints.txt.
COPY pyproject.toml constraints.txt README.md* ./
COPY functions/ functions/
COPY events/ events/
COPY main.py ./
# Only [project] dependencies (no extras: no kubernetes, no rich). pip byte-compiles what it
# installs; compileall covers /app too, since PYTHONDONTWRITEBYTECODE stops the (read-only)
# runtime from caching .pyc and every cold start would compile our modules again.
RUN pip install --no-cache-dir -c constraints.txt . \
    && python -m compileall -q /app \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin loraflow

USER 10001
EXPOSE 8080

# FUNCTION_TARGET (admit, stat, verify, load, reload, unload, resync, ingest) comes from the
# environment; functions-framework reads it and PORT.
CMD ["functions-framework", "--source", "main.py", "--signature-type", "http"]
