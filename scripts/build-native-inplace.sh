#!/usr/bin/env bash
# Build native/ into the checkout's root as skewless_native<EXT_SUFFIX> (gitignored) for the Python named by
# $PYTHON (default: python3), which run from that checkout imports before the venv's copy: for a git worktree
# sharing another checkout's venv. `make native` (maturin develop) is the normal way.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
PYO3_PYTHON=$(command -v "$python") cargo build --quiet --release --features extension-module \
    --manifest-path "$root/native/Cargo.toml"
# Copied then renamed: overwriting the file in place would change the pages of a running process that loaded it
# (a test run in another shell crashes with SIGSEGV).
cp "$root/native/target/release/libskewless_native.so" "$root/.skewless_native$suffix.tmp"
mv -f "$root/.skewless_native$suffix.tmp" "$root/skewless_native$suffix"
