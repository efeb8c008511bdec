"""What MiB and GiB mean, once: binary units (SGLang prints GiB and calls them "GB").

Sizes computed from shapes are bytes; readings of a device or a log are MiB. A module names the conversion it
needs from here instead of writing `1 << 20` or `1024.0` again.
"""

from __future__ import annotations

BYTES_PER_MIB = 1 << 20
BYTES_PER_GIB = 1 << 30
MIB_PER_GIB = 1024.0  # SGLang's "GB" in its logs is GiB: `avail mem=12.34 GB` is 12.34 × 1024 MiB
