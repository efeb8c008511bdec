#!/usr/bin/env bash
# The pip requirement of the KV-transfer engine prefill-only workers use (mooncake over TCP):
# the CUDA 13 build on GPU nodes, the non-CUDA build elsewhere (CI, laptops).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "mooncake-transfer-engine-cuda13"
else
  echo "mooncake-transfer-engine-non-cuda==0.3.13.post1"
fi
