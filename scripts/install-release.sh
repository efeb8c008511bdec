#!/usr/bin/env bash
# Install one older sglang release, without dependencies, into its own directory, with the transformers
# and tokenizers it pins: put the directory first on PYTHONPATH to resolve with that release while the
# 0.5.23 install provides everything else (torch, etc.).
set -euo pipefail
rel="$1"; dest="$2"
py="${PY:-.venv/bin/python}"
case "$rel" in
  0.5.12) tf=5.6.0 ;;
  0.5.13|0.5.14) tf=5.8.1 ;;
  0.5.22|0.5.23) tf=5.19.0 ;;
  *) tf=5.12.1 ;;
esac
case "$rel" in 0.5.22|0.5.23) tk=0.23.2 ;; *) tk=0.22.2 ;; esac
echo "installing sglang==$rel (transformers==$tf, tokenizers==$tk) into $dest"
rm -rf "$dest"
"$py" -m pip install -q --no-deps --target "$dest" "sglang==$rel" "transformers==$tf" "tokenizers==$tk"
