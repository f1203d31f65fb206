#!/usr/bin/env bash
# System tools Skewless needs beyond Python: Java 17+ and Maven (Kafka/Spark jars), and the NTP clients used by
# the interop tests (chrony, sntp, ntpdate). Installs only what is missing, with apt-get, when running as root.
set -euo pipefail

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${missing[*]} (install them, or run as root to let this script do it)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$here/install-ntp-tools.sh" ]; then
  bash "$here/install-ntp-tools.sh"
fi

# promtool (Debian's prometheus package) validates deploy/prometheus-rules.yml in the tests; optional elsewhere.
if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "promtool not found: the alert-rule checks that need it will be skipped (apt-get install prometheus)" >&2
  fi
fi
