"""How long (reference time) every core keeps released results correctable by late events, unless configured:
one hour, the Spark jobs' `--allowed-lateness` default."""

DEFAULT_ALLOWED_LATENESS_US = 3_600_000_000
