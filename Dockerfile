# syntax=docker/dockerfile:1.7
# edgecut: the HTTP service under gunicorn. Build: docker build -t edgecut .
# Run with the embedded store (one worker):  docker run -p 8000:8000 edgecut
# With Redis (several workers), nginx in front: docker compose up
# The server image installs the service alone: no plotting or progress-bar packages (the
# `plots` extra is for the study and evaluation commands).
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY schemas ./schemas
COPY service ./service
COPY edgecut ./edgecut
# service/ui/examples links to these; the wheel gets copies.
COPY examples ./examples
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/edgecut-metrics
# Graphviz's dot draws the policy trees (/ui's tree panel, /v1/tree as SVG or PNG).
RUN apt-get update \
 && apt-get install -y --no-install-recommends graphviz \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin edgecut \
 && mkdir -p /tmp/edgecut-metrics && chown edgecut /tmp/edgecut-metrics
# Mounted, not copied: the wheels never become a layer of the final image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl
WORKDIR /app
USER edgecut
EXPOSE 8000
# /healthz needs no store; python is in the image, curl is not.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"]
# Exec form: gunicorn is PID 1 and receives SIGTERM itself (graceful shutdown, 20 s).
CMD ["gunicorn", "--config", "python:service.gunicorn_conf", "--bind", "0.0.0.0:8000", "service.app:create_app()"]
