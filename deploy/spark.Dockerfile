# Spark image, one for every role of a standalone cluster (deploy/compose.yaml):
#   master     spark-class org.apache.spark.deploy.master.Master --host spark-master
#   worker     spark-class org.apache.spark.deploy.worker.Worker spark://spark-master:7077
#   jobs       spark-submit --master spark://spark-master:7077 --packages <connector> ... $SKEWLESS_SUBMIT <job> ...
# Spark is pyspark's own distribution (its jars, bin/spark-class, bin/spark-submit) in the venv /opt/skewless, with
# the skewless wheel installed: executors import spark_jobs, cep, contract and broker from it
# (spark.pyspark.python=/opt/skewless/bin/python), the driver runs spark_jobs/submit.py from it. Spark's Kafka
# connector comes from Maven Central through spark-submit --packages (its coordinate matches the pinned pyspark).
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/skewless/bin:$PATH \
    SPARK_HOME=/opt/skewless/lib/python3.11/site-packages/pyspark \
    SKEWLESS_SUBMIT=/opt/skewless/lib/python3.11/site-packages/spark_jobs/submit.py \
    SKEWLESS_SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
    SPARK_WORKER_DIR=/var/lib/skewless/spark-work
# The JRE's postinst links man pages into /usr/share/man/man1, which slim images leave out. The volumes' mount points
# are made here, owned by the uid everything runs as: a fresh named volume takes that ownership.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless=17.* \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 skewless \
    && useradd --system --uid 10001 --gid skewless --home-dir /home/skewless --create-home skewless \
    && mkdir -p /var/lib/skewless/checkpoints /var/lib/skewless/spark-work \
    && chown -R 10001:10001 /var/lib/skewless
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
RUN python -m venv /opt/skewless \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels . \
    && pip install --no-cache-dir --find-links=/tmp/wheels -c constraints.txt "skewless[spark]==0.1.0" \
    && rm -rf /tmp/wheels \
    && test -x "$SPARK_HOME/bin/spark-class" && test -f "$SKEWLESS_SUBMIT"
# Every role (master, worker, spark-submit's driver) reads $SPARK_HOME/conf/log4j2.properties: the project's quiet
# configuration (docs/spark-jobs.md), the same file a bare run generates at the default level.
COPY deploy/spark-log4j2.properties $SPARK_HOME/conf/log4j2.properties
USER 10001:10001
WORKDIR /home/skewless
# 7077 master RPC, 8080 master UI, 8081 worker UI, 4040 a driver's UI.
EXPOSE 7077 8080 8081 4040
# A bare container runs one job in local mode (the compose services give the cluster roles their commands).
CMD ["skewless", "spark", "window-count", "--bootstrap", "kafka:9092", "--checkpoint", "/var/lib/skewless/checkpoints/window_count"]
