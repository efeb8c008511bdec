"""The constants of sglang's reservation heuristic (term-by-term rule sets, 0.5.3rc2 … 0.5.23), named once.

Each is read from `sglang/srt/arg_groups/memory_hook.py` of 0.5.23 (`handle_gpu_memory_settings`,
`reserve_for_graph_mb`, `reserve_for_deepep_a2a_mb`); the same numbers sit in `server_args.py` of the older
term-by-term releases. The heuristic model (`model.py`), the rule sets (`rules.py`), and the calibration
(fitting, the calibrated reserve, the memory_hook patch, the audit) all import them from here, so a constant
that moves in sglang moves in one line of memfrac. All in MiB.
"""

from __future__ import annotations

#: `reserved_mem = 512`: constant meta data (attention backends, …).
CONSTANT_MIB = 512.0
#: `reserved_mem += activation_tokens * 1.5`: MiB per activation token.
ACTIVATION_MIB_PER_TOKEN = 1.5
#: `reserved_mem += cfg.tp_size * cfg.pp_size / 8 * 1024`: 128 MiB per tp·pp.
PARALLEL_MIB_PER_TP_PP = 1024 / 8
#: `reserved_mem += decode_cuda_graph_config.max_bs * 2`: MiB per decode-graph batch size.
DECODE_GRAPH_MIB_PER_BS = 2.0
#: `reserved_mem += len(prefill_cuda_graph_config.bs) * 8`: MiB per prefill-graph bucket (non-MLA).
PREFILL_GRAPH_MIB_PER_BUCKET = 8.0
#: `reserved_mem += 1.5 * 1024`: the MLA models' flat prefill-graph reserve.
PREFILL_GRAPH_MLA_MIB = 1536.0
#: `reserved_mem = max(reserved_mem, 10 * 1024)`: the floor of the pre-floor terms …
FLOOR_MIB = 10 * 1024.0
#: … on GPUs above `gpu_mem > 60 * 1024` MiB.
FLOOR_GPU_MIB = 60 * 1024
#: `return 2 * 1024` (reserve_for_deepep_a2a_mb): DeepEP all-to-all, added after the floor (0.5.15+).
DEEPEP_A2A_MIB = 2 * 1024.0
#: `reserved_mem += 2 * 1024` on XPU, after the floor (0.5.20+).
XPU_MIB = 2 * 1024.0
#: The minimum activation tokens: `max(…, 2048)`.
MIN_ACTIVATION_TOKENS = 2048

#: The pre-floor terms (summed, then lifted to the floor) and the post-floor ones (added after it).
PRE_FLOOR_TERMS = ("constant", "activation", "parallel", "decode_graph", "dp_padding", "prefill_graph",
                   "prefill_bcg_deepep")  # fmt: skip
POST_FLOOR_TERMS = ("deepep_a2a", "speculative", "xpu")
