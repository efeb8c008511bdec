#!/usr/bin/env bash
# System libraries the real KV-transfer engine (mooncake) needs to load: libibverbs (+ libnl).
# Installed with apt-get when missing and we are root; otherwise say what to install and go on
# (only the prefill-worker tests need it, and they say so when it is absent).
set -uo pipefail
if ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing libibverbs1 (mooncake's RDMA library; also used for its TCP transport)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libibverbs1) >/dev/null \
    || echo "warning: apt-get install libibverbs1 failed; prefill-worker tests will be skipped" >&2
else
  echo "note: libibverbs1 is missing (install it: apt-get install libibverbs1); prefill-worker tests will be skipped" >&2
fi
exit 0
