# Gateway image: the asyncio gateway (uvloop) and time-sync server; Kafka and Spark run in their own images.

# The native data plane (native/, Rust + PyO3) as a CPython 3.11 wheel (not abi3: the limited API's function calls
# cost 4-11 % of its in-process per-event time; docs/native.md), built by maturin with the official Rust image's toolchain
# (rust-version in native/Cargo.toml) for the runtime stage's Python; Cargo.lock pins every crate.
FROM rust:1.86-slim-bookworm AS native
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.11.* python3-venv=3.11.* \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/maturin \
    && /opt/maturin/bin/pip install --no-cache-dir maturin==1.16.0
WORKDIR /src
COPY native ./native
RUN /opt/maturin/bin/maturin build --release --locked --manifest-path native/Cargo.toml --interpreter python3.11 \
    --out /wheels

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY contract ./contract
COPY broker ./broker
COPY skewless ./skewless
COPY gateway ./gateway
COPY timesync ./timesync
COPY reorder ./reorder
COPY clients ./clients
COPY spark_jobs ./spark_jobs
COPY cep ./cep
# The gateway extra at the versions the project is tested with (pyproject.toml holds ranges, constraints.txt pins).
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt ".[gateway]"
COPY --from=native /wheels/ /wheels/

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 skewless \
    && useradd --system --uid 10001 --gid skewless --home-dir /home/skewless --create-home skewless
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels "skewless[gateway]==0.1.0" skewless-native==0.1.0 \
    && rm -rf /wheels
USER 10001:10001
WORKDIR /home/skewless
# 7700/tcp events from sources; 7452/udp NTP-format time sync; 7780/tcp /metrics and /healthz (--metrics-port).
# A cluster member (compose) gets its own ports through the flags.
EXPOSE 7700/tcp 7452/udp 7780/tcp
ENTRYPOINT ["skewless"]
CMD ["gateway", "--host", "0.0.0.0", "--port", "7700", "--timesync-port", "7452", "--bootstrap", "kafka:9092", "--metrics-host", "0.0.0.0", "--metrics-port", "7780"]
