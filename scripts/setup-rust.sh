#!/usr/bin/env bash
# The Rust toolchain for native/ (cargo, rustfmt, clippy): use the one on PATH or in ~/.cargo, else Debian's.
set -euo pipefail

if command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "cargo not found: install Rust >= 1.80 (https://rustup.rs, or apt-get install cargo rustfmt rust-clippy)," \
       "then run make again" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cargo rustfmt rust-clippy >/dev/null
