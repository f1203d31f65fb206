"""How far this host's clock (a gateway's reference clock) may be from common time, as its NTP daemon reports it.

chrony's bound (chronyc(1), `tracking`): |system time offset| + root dispersion + root delay / 2, all in seconds in
the CSV output of ``chronyc -c tracking``, whose columns are: reference ID, reference name, stratum, reference time,
system time, last offset, RMS offset, frequency, residual frequency, skew, root delay, root dispersion, update
interval, leap status.
"""

from __future__ import annotations

import subprocess

CHRONYC_TIMEOUT_S = 5.0
_SYSTEM_TIME, _ROOT_DELAY, _ROOT_DISPERSION, _LEAP_STATUS = 4, 10, 11, 13


class ReferenceClockError(RuntimeError):
    """The host's NTP daemon could not say how good its clock is (not running, not synchronised, odd output)."""


def chrony_error_bound_us(tracking_csv: str) -> int:
    """The error bound of ``chronyc -c tracking``'s line, in microseconds (rounded up)."""
    fields = tracking_csv.strip().split(",")
    if len(fields) < _LEAP_STATUS + 1:
        raise ReferenceClockError(f"unexpected chronyc tracking output: {tracking_csv.strip()!r}")
    if fields[_LEAP_STATUS].strip().lower() == "not synchronised":
        raise ReferenceClockError("chrony is not synchronised: this host's clock has no error bound")
    try:
        system_s = abs(float(fields[_SYSTEM_TIME]))
        delay_s = float(fields[_ROOT_DELAY])
        dispersion_s = float(fields[_ROOT_DISPERSION])
    except ValueError as exc:
        raise ReferenceClockError(f"unexpected chronyc tracking output: {tracking_csv.strip()!r}") from exc
    bound_s = system_s + dispersion_s + delay_s / 2
    return int(-(-bound_s * 1_000_000 // 1))


def read_chrony_error_bound_us(chronyc: str = "chronyc") -> int:
    """Ask the local chronyd (blocking, at most CHRONYC_TIMEOUT_S)."""
    try:
        result = subprocess.run([chronyc, "-c", "tracking"], capture_output=True, text=True, check=False,
                                timeout=CHRONYC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReferenceClockError(f"could not run {chronyc}: {exc}") from exc
    if result.returncode != 0:
        raise ReferenceClockError(f"{chronyc} -c tracking failed: {result.stderr.strip() or result.stdout.strip()}")
    return chrony_error_bound_us(result.stdout.splitlines()[0] if result.stdout else "")
