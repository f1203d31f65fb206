# Spark job image: pyspark (local[*] driver) + the Skewless jobs; the Kafka connector comes from Maven Central
# through Spark's own package resolution (SKEWLESS_SPARK_PACKAGES).
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SKEWLESS_SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
    SKEWLESS_SPARK_MASTER=local[2] \
    SPARK_LOCAL_IP=127.0.0.1
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless=17.* \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY skewless ./skewless
COPY gateway ./gateway
COPY timesync ./timesync
COPY reorder ./reorder
COPY clients ./clients
COPY spark_jobs ./spark_jobs
COPY cep ./cep
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels . \
    && pip install --no-cache-dir --find-links=/tmp/wheels "skewless[spark]==0.1.0" \
    && rm -rf /tmp/wheels \
    && groupadd --system --gid 10001 skewless \
    && useradd --system --uid 10001 --gid skewless --home-dir /home/skewless --create-home skewless
USER 10001:10001
WORKDIR /home/skewless
ENTRYPOINT ["skewless", "spark"]
CMD ["window-count", "--bootstrap", "kafka:9092", "--checkpoint", "/home/skewless/checkpoints/window_count"]
