"""What the heuristic and the KV arithmetic need from a model's Hugging Face `config.json`.

Read once, without transformers: the architecture (is it MLA? multimodal? MoE?), the shapes that set the
weight bytes per GPU and the KV bytes per token. The weight and parameter figures are estimates from the
layer shapes (stated as such wherever they are shown); the KV bytes per token are exact for the layouts
SGLang uses (GQA/MHA heads sharded by attention-TP, MLA latent replicated).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from profiler.core.errors import FieldError, MemfracError
from profiler.core.validate import json_object

# Architectures SGLang serves with its MLA attention (sglang/srt/configs/model_config.py, 0.5.23).
MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM",
        "LongcatFlashForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "KimiVLForConditionalGeneration",
        "KimiLinearForCausalLM",
        "MiniCPM3ForCausalLM",
        "DeepseekVL2ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM",
        "SarvamMLAForCausalLM",
        "Glm5NextForConditionalGeneration",
    }
)

# The marks sglang's draft-model architectures carry: `ModelConfig._config_draft_model` renames a target's
# architecture for a speculative draft (DeepseekV3ForCausalLM -> DeepseekV3ForCausalLMNextN, Qwen3NextForCausalLM ->
# Qwen3NextForCausalLMMTP, DeepseekV4ForCausalLM -> DeepseekV4ForCausalLMDSpark, ...), and eagle / DFlash / DSpark
# heads are classes of their own (LlamaForCausalLMEagle3, DFlashDraftModel, DSparkMiniMaxDraftModel). No target
# architecture of 0.5.23 carries one (tests/model/test_draft_arch.py checks both against sglang's code).
_DRAFT_MARKS = re.compile(r"NextN|MTP|Eagle|Draft|DFlash|DSpark")


def is_draft_architecture(name: str) -> bool:
    """Whether an architecture name (a "Load weight end. type=..." field) is a speculative draft model's."""
    return _DRAFT_MARKS.search(name) is not None


_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1,
    "fp4": 0.5, "fp4_e2m1": 0.5,
}  # fmt: skip


def dtype_bytes(name: str) -> float:
    """Bytes per element of a dtype name as used by HF configs and sglang's --kv-cache-dtype."""
    try:
        return _DTYPE_BYTES[name.lower().replace("torch.", "")]
    except KeyError:
        raise MemfracError(f"unknown dtype {name!r}; known: {', '.join(sorted(_DTYPE_BYTES))}") from None


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The shapes of one model, read from its config.json."""

    path: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    is_mla: bool
    is_multimodal: bool
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    num_experts: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    quantization: str = ""  # "fp8" when linear weights are stored in FP8 (block-quantized checkpoints)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- parameters -------------------------------------------------------------------------------
    def _attention_params(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk)
                if self.q_lora_rank
                else h * self.num_heads * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv += self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.num_heads * self.v_head_dim * h
        q = h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        return q + kv + self.num_heads * self.head_dim * h

    def _dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def _expert_params(self) -> int:
        """Routed experts of one MoE layer (the part expert parallelism shards)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def _moe_replicated_params(self) -> int:
        """Shared experts and the router of one MoE layer."""
        return (
            self.num_shared_experts * 3 * self.hidden_size * self.moe_intermediate_size
            + self.hidden_size * self.num_experts
        )

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def param_count(self) -> int:
        """Estimated parameters of the served model (no MTP/draft layers), from the layer shapes."""
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        dense_layers = self.num_layers - self.num_moe_layers
        per_layer_attn = self._attention_params()
        moe = self.num_moe_layers * (self._expert_params() + self._moe_replicated_params())
        return embed + self.num_layers * per_layer_attn + dense_layers * self._dense_mlp_params() + moe

    # ---- per-GPU bytes ----------------------------------------------------------------------------
    def weight_bytes_per_gpu(self, tp: int = 1, pp: int = 1, attn_dp: int = 1) -> int:
        """Estimated weight bytes one GPU holds: attention sharded over attention-TP (tp/attn_dp),
        MLPs and experts over tp (experts over ep×moe-tp = tp), embeddings vocab-parallel over tp, layers
        split over pp. FP8 checkpoints store linear weights in 1 byte (+ fp32 128×128 block scales)."""
        base = dtype_bytes(self.dtype)
        lin = 1 + 4 / (128 * 128) if self.quantization == "fp8" else base
        attn_tp = max(1, tp // max(1, attn_dp))
        layers = self.num_layers / pp
        dense_layers = (self.num_layers - self.num_moe_layers) / pp
        moe_layers = self.num_moe_layers / pp
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) / tp * base
        attn = layers * self._attention_params() / attn_tp * lin
        mlp = dense_layers * self._dense_mlp_params() / tp * lin
        experts = moe_layers * (self._expert_params() / tp * lin + self._moe_replicated_params() / tp * lin)
        return int(embed + attn + mlp + experts)

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1, attn_dp: int = 1, kv_dtype: str = "auto") -> int:
        """KV-cache bytes per token on one GPU, all layers it holds.

        GQA/MHA: K and V, each kv_heads/attention-TP heads (at least one: heads are replicated when the
        attention-TP size exceeds the KV head count). MLA: one latent of kv_lora_rank + rope dims, the
        same on every rank.
        """
        elem = dtype_bytes(self.dtype if kv_dtype in ("auto", "", None) else kv_dtype)
        layers = math.ceil(self.num_layers / pp)
        if self.is_mla:
            return int(layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elem)
        attn_tp = max(1, tp // max(1, attn_dp))
        heads = max(1, self.num_kv_heads // attn_tp)
        return int(2 * layers * heads * self.head_dim * elem)


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def load_model_config(model_dir: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a model directory (or the file itself): a UTF-8 JSON object, or one line."""
    p = Path(model_dir)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.exists():
        raise MemfracError(f"model config not found: {cfg_path} (a model is a directory holding config.json)")
    return json_object(cfg_path, "a Hugging Face config.json (a JSON object)")


def load_model_shape(model_dir: str) -> ModelShape:
    """Read `<model_dir>/config.json`, checked (cached per path and content: a config rewritten in place is
    read again, never answered from a shape of its old bytes)."""
    p = Path(model_dir)
    cfg_path = p / "config.json" if p.is_dir() else p
    try:
        digest = hashlib.sha256(cfg_path.read_bytes()).hexdigest()
    except OSError:
        digest = ""  # load_model_config says what is wrong with it
    return _shape(str(model_dir), str(cfg_path), digest)


def is_draft_model(model_dir: str | Path) -> bool:
    """A speculative draft head (EAGLE/EAGLE3: an `*Eagle*` architecture), not a model a worker serves alone: it
    is a scenario's `speculative_draft_model`, never its `model` (the audit leaves it out)."""
    archs = load_model_config(model_dir).get("architectures") or []
    return any("Eagle" in str(a) for a in archs)


@cache
def _shape(model_dir: str, cfg_path: str, digest: str) -> ModelShape:
    return shape_from_config(load_model_config(model_dir), model_dir, cfg_path)


def _count(cfg: dict[str, Any], file: str, prefix: str, keys: tuple[str, ...], default: Any, lo: int = 0) -> int:
    """An integer field (the first of `keys` present), ≥ `lo` (and < 2^31: no layer count or width is larger)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        if default is None:
            raise FieldError(file, prefix + keys[0], None, f"an integer {lo}..{2**31 - 1} (every LLM config has it)")
        return int(default)
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < 2**31:
        raise FieldError(file, prefix + key, v, f"an integer {lo}..{2**31 - 1}")
    return int(v)


def _table(cfg: dict[str, Any], file: str, key: str) -> dict[str, Any] | None:
    v = cfg.get(key)
    if v is not None and not isinstance(v, dict):
        raise FieldError(file, key, v, "a JSON object")
    return v


def shape_from_config(raw: dict[str, Any], path: str = "", file: str = "") -> ModelShape:
    """Build a ModelShape from a parsed HF config (text config of multimodal models included). Every field it
    reads is checked: a wrong type or a negative count is a FieldError naming `file` and the key."""
    file = file or path or "config.json"
    archs = raw.get("architectures") or ["unknown"]
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise FieldError(file, "architectures", archs, 'a list of class names, e.g. ["LlamaForCausalLM"]')
    arch = archs[0]
    sub = "text_config" if raw.get("text_config") is not None else "llm_config"
    text = _table(raw, file, sub) or raw
    pre = f"{sub}." if text is not raw else ""
    vision = "vision_config" in raw or "vision_config" in text
    multimodal = vision or arch.endswith("ForConditionalGeneration")
    hidden = _count(text, file, pre, ("hidden_size", "d_model"), None, 1)
    heads = _count(text, file, pre, ("num_attention_heads", "n_head"), None, 1)
    n_experts = _count(text, file, pre, ("n_routed_experts", "num_experts", "num_local_experts"), 0)
    quant = _table(raw, file, "quantization_config") or _table(text, file, "quantization_config") or {}
    qm = str(quant.get("quant_method", "")).lower()
    if text.get("first_k_dense_replace") is not None:
        first_dense = _count(text, file, pre, ("first_k_dense_replace",), 0)
    else:
        mlp_only = text.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list):
            raise FieldError(file, pre + "mlp_only_layers", mlp_only, "a list of layer indices")
        first_dense = len(mlp_only)
    is_mla = arch in MLA_ARCHITECTURES and text.get("kv_lora_rank") is not None
    dtype = _first(raw, "torch_dtype", "dtype", default=text.get("torch_dtype", "bfloat16"))
    if not isinstance(dtype, str):
        raise FieldError(file, "torch_dtype", dtype, "a dtype name, e.g. \"bfloat16\"")
    dtype_bytes(dtype)  # an unknown dtype is refused here, not when the first size is computed
    tie = _first(raw, "tie_word_embeddings", default=text.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        raise FieldError(file, "tie_word_embeddings", tie, "true | false")

    def count(key: str, default: Any = 0, lo: int = 0, *alts: str) -> int:
        return _count(text, file, pre, (key, *alts), default, lo)

    return ModelShape(
        path=path,
        architecture=arch,
        model_type=str(raw.get("model_type", "")),
        hidden_size=hidden,
        num_layers=count("num_hidden_layers", None, 1, "n_layer"),
        num_heads=heads,
        num_kv_heads=count("num_key_value_heads", heads, 1),
        head_dim=count("head_dim", hidden // heads, 1),
        intermediate_size=count("intermediate_size", 4 * hidden),
        vocab_size=count("vocab_size"),
        tie_word_embeddings=tie,
        dtype=dtype,
        is_mla=is_mla,
        is_multimodal=multimodal,
        kv_lora_rank=count("kv_lora_rank"),
        qk_rope_head_dim=count("qk_rope_head_dim"),
        qk_nope_head_dim=count("qk_nope_head_dim"),
        v_head_dim=count("v_head_dim"),
        q_lora_rank=count("q_lora_rank"),
        num_experts=n_experts,
        moe_intermediate_size=count("moe_intermediate_size"),
        num_shared_experts=count("n_shared_experts", 0, 0, "num_shared_experts"),
        num_dense_layers=first_dense if n_experts else 0,
        quantization="fp8" if qm == "fp8" else qm,
    )
