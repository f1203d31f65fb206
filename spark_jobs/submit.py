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


def main(argv: list[str] | None = None) -> None:
    """The jobs' options as `skewless spark` takes them; an error is one line on stderr and a non-zero exit (2: the
    command line, 1: the run), its traceback only with ``--debug``, as everywhere else."""
    _import_path()
    import typer

    from spark_jobs.cli import spark_app

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        result = typer.main.get_command(spark_app).main(args, prog_name="submit.py", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # no command: the help text, as `skewless spark` shows it
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        print(f"error: {where}{exc.format_message()}{hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
