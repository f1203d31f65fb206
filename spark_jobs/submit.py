"""The `.py` entry point for spark-submit: the same commands and options as `skewless spark ...`.

    spark-submit --master spark://host:7077 \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \\
        --conf spark.pyspark.python=/opt/skewless/bin/python \\
        --conf spark.skewless.kafka.security.protocol=SASL_SSL \\
        spark_jobs/submit.py three-window --bootstrap kafka:9092 --checkpoint /shared/ckpt/three_window

spark-submit's master and conf stand (spark_jobs/session.py); docs/spark-jobs.md, "On a cluster". Kafka settings
travel as ``spark.skewless.kafka.<property>`` (Spark's Kafka source and sink) and
``spark.skewless.librdkafka.<property>`` (the jobs' own confluent-kafka clients): docs/consume.md.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _import_path() -> None:
    """Python puts a script's own directory first on sys.path: here that would let spark_jobs/contract.py shadow
    the top-level `contract` package. The checkout root goes last instead, so a driver started from a checkout
    finds the packages without an install, and an installed or --py-files copy still comes first."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    sys.path.append(str(here.parent))


def main() -> None:
    _import_path()
    from spark_jobs.cli import spark_app

    spark_app(prog_name="submit.py")


if __name__ == "__main__":
    main()
