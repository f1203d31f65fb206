"""Example jobs for Spark users (docs/consume.md): real files, run by the tests."""
