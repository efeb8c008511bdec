#!/usr/bin/env bash
# System packages the tests need, installed with apt-get when missing and we are root; otherwise say what to
# install and go on (the tests that need them say so when they are absent):
#   libibverbs1  mooncake's RDMA library (also used for its TCP transport): the prefill-worker tests
#   chromium     headless Chromium renders report.html in tests/test_report_browser.py (~32 s to install on
#                a fresh machine, apt-get update included; CI=true makes that test fail rather than skip without it)
set -uo pipefail
missing=()
ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 ' || missing+=(libibverbs1)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} (system packages the tests use)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}") >/dev/null \
    || echo "warning: apt-get install ${missing[*]} failed; the tests that need them will be skipped" >&2
else
  echo "note: missing system packages: ${missing[*]} (install them: apt-get install ${missing[*]}); the tests that need them will be skipped" >&2
fi
exit 0
