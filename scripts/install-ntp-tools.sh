#!/usr/bin/env bash
# Install the NTP tools the timesync interop tests and benchmark use: chronyd, sntp, ntpdate.
# Idempotent: only missing tools are installed, `apt-get update` runs at most once.
# Needs root (or sudo) on Debian/Ubuntu. The chrony package may start a system chronyd that
# would discipline this machine's clock; it is stopped again here (the tests run `chronyd -Q`,
# which never sets the clock).
set -euo pipefail

if [[ ${EUID} -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -n -- "$0" "$@"
  fi
  echo "install-ntp-tools: must run as root" >&2
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-ntp-tools: apt-get not found; install chrony, sntp and ntpdate by hand" >&2
  exit 1
fi

have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]] || [[ -x "/sbin/$1" ]]; }

packages=()
chrony_was_present=1
if ! have chronyd; then
  packages+=(chrony)
  chrony_was_present=0
fi
have sntp || packages+=(sntp)
if ! have ntpdate && ! have ntpdig; then
  if apt-cache show ntpsec-ntpdate >/dev/null 2>&1; then
    packages+=(ntpsec-ntpdate)
  else
    packages+=(ntpdate)
  fi
fi

if [[ ${#packages[@]} -eq 0 ]]; then
  echo "install-ntp-tools: chronyd, sntp and ntpdate already present"
  exit 0
fi

# Update the package lists once, unless they are already there.
if ! compgen -G "/var/lib/apt/lists/*_Packages" >/dev/null; then
  apt-get update
fi

export DEBIAN_FRONTEND=noninteractive
# Keep the package scripts from starting daemons (containers, CI runners).
policy_created=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  policy_created=1
fi
trap '[[ ${policy_created} -eq 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT

if ! apt-get install -y --no-install-recommends "${packages[@]}"; then
  apt-get update
  apt-get install -y --no-install-recommends "${packages[@]}"
fi

# Never leave a system chronyd running that we started by installing the package.
if [[ ${chrony_was_present} -eq 0 ]]; then
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl stop chrony.service >/dev/null 2>&1 || true
    systemctl disable chrony.service >/dev/null 2>&1 || true
  fi
  if [[ -r /run/chrony/chronyd.pid ]]; then
    kill "$(cat /run/chrony/chronyd.pid)" 2>/dev/null || true
  fi
fi
echo "install-ntp-tools: installed ${packages[*]}"
