#!/usr/bin/env bash
# Install one older sglang release, without dependencies, into its own directory, with the transformers
# and tokenizers it needs over today's stack: put the directory first on PYTHONPATH to resolve with that
# release while the 0.5.23 install provides everything else (torch, etc.).
#   0.4.0 … 0.5.10.post1: the 0.5.23 install's transformers imports them (their 4.x pins are not needed by
#     the resolver), except 0.4.3.post1 … 0.4.4.post1, whose qwen2.5-VL config imports transformers 4.48's
#     `image_utils.VideoInput` (transformers 4.48.3 as 0.4.4 pins it, with the hub/tokenizers it accepts);
#   0.5.11 …: the transformers the release pins (today's registers configs those releases register again).
set -euo pipefail
rel="$1"; dest="$2"
py="${PY:-.venv/bin/python}"
extra=()
case "$rel" in
  0.4.3.post[1-4]|0.4.4|0.4.4.post1) extra=(transformers==4.48.3 tokenizers==0.21.0 huggingface-hub==0.28.1) ;;
  0.4.*|0.5.[0-9]|0.5.[0-9].*|0.5.[0-9]rc*|0.5.10|0.5.10.*|0.5.10rc*) ;;
  0.5.11|0.5.12|0.5.12.*) extra=(transformers==5.6.0 tokenizers==0.22.2) ;;
  0.5.13|0.5.13.*|0.5.14) extra=(transformers==5.8.1 tokenizers==0.22.2) ;;
  0.5.22|0.5.23) extra=(transformers==5.19.0 tokenizers==0.23.2) ;;
  *) extra=(transformers==5.12.1 tokenizers==0.22.2) ;;
esac
echo "installing sglang==$rel ${extra[*]:-(no pins: the venv transformers)} into $dest"
rm -rf "$dest"
"$py" -m pip install -q --no-deps --target "$dest" "sglang==$rel" "${extra[@]}"
