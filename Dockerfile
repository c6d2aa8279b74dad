# Magnetar's one image: every service is `magnetar <command>` (broker, bookie, proxy, bk, ...);
# the Kubernetes manifests in deploy/k8s choose the command. Build: docker build -t magnetar .
# (or podman build). Probes are Kubernetes' business: no HEALTHCHECK here.

# -- build: wheels of Magnetar and its runtime dependencies (compilers, if any wheel needs one,
#    stay in this stage) --------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY services ./services
COPY spark ./spark
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

# -- run: the wheels installed, nothing else ---------------------------------------------------
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels magnetar \
    && groupadd --system --gid 10001 magnetar \
    && useradd --system --uid 10001 --gid magnetar --home-dir /var/lib/magnetar \
       --shell /usr/sbin/nologin magnetar \
    && mkdir -p /var/lib/magnetar \
    && chown magnetar:magnetar /var/lib/magnetar
WORKDIR /var/lib/magnetar
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
# Pulsar protocol, broker/proxy HTTP, bookie protocol, bookie HTTP.
EXPOSE 6650 8080 3181 8000
ENTRYPOINT ["magnetar"]
CMD ["--help"]
