"""`python -m spark_jobs.package [OUT]`: the Python code executors need, as one zip for `spark-submit --py-files`.

Executors unpickle the jobs' functions, which import spark_jobs and what it imports of ours (PYFILES_PACKAGES, kept
complete by a unit test). Third-party modules are not in the zip: the workers' Python (spark.pyspark.python) needs
pandas, pyarrow, msgpack, orjson and confluent-kafka installed (the `skewless[spark]` extra has them).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PYFILES_PACKAGES = ("spark_jobs", "cep", "contract", "broker")
DEFAULT_OUTPUT = Path("dist") / "skewless-pyfiles.zip"
ROOT = Path(__file__).resolve().parents[1]
# A fixed timestamp: the same sources make the same zip, byte for byte.
_EPOCH_1980 = (1980, 1, 1, 0, 0, 0)


def package_files(root: Path = ROOT) -> list[Path]:
    """Every module and typing marker of the packages, relative to the checkout root."""
    found: list[Path] = []
    for package in PYFILES_PACKAGES:
        found += [p.relative_to(root) for p in (root / package).rglob("*")
                  if p.suffix == ".py" or p.name == "py.typed"]
    return sorted(found)


def write_pyfiles_zip(output: Path, root: Path = ROOT) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative in package_files(root):
            info = zipfile.ZipInfo(relative.as_posix(), _EPOCH_1980)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, (root / relative).read_bytes())
    return output


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    output = write_pyfiles_zip(Path(args[0]) if args else DEFAULT_OUTPUT)
    print(output)


if __name__ == "__main__":
    main()
