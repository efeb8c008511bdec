"""`is_draft_architecture` against sglang 0.5.23's own code: every architecture `ModelConfig._config_draft_model`
gives a draft is marked, and no target architecture it renames from is."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from profiler.model.modelcfg import is_draft_architecture
from tests.conftest import needs_sglang


def _draft_config_source() -> ast.FunctionDef:
    spec = importlib.util.find_spec("sglang.srt.configs.model_config")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_config_draft_model":
            return node
    raise AssertionError("sglang's ModelConfig has no _config_draft_model")


def _strings(node: ast.AST) -> set[str]:
    return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def _renames(fn: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """(architectures assigned to a draft's hf_config.architectures, architectures compared against)."""
    assigned: set[str] = set()
    compared: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and "architectures" in ast.unparse(node.targets[0]):
            assigned |= {
                c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
        elif isinstance(node, ast.Compare) and "architectures" in ast.unparse(node.left):
            for comp in node.comparators:
                compared |= {
                    c.value for c in ast.walk(comp) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return assigned, compared


@needs_sglang
def test_every_draft_rename_in_sglang_is_marked() -> None:
    assigned, compared = _renames(_draft_config_source())
    assert len(assigned) >= 20, assigned  # 0.5.23 renames 24 architectures for a draft
    assert {a for a in assigned if not is_draft_architecture(a)} == set()
    targets = compared - assigned
    assert {"DeepseekV3ForCausalLM", "Qwen3NextForCausalLM", "Glm4MoeForCausalLM"} <= targets
    # the targets it renames from: none marked (a checkpoint's own draft class, e.g. DSparkMiniMaxDraftModel, is
    # compared too, and is a draft)
    assert {t for t in targets if is_draft_architecture(t) and "Draft" not in t} == set()


@pytest.mark.parametrize(
    ("name", "draft"),
    [
        ("DeepseekV3ForCausalLMNextN", True),  # sglang-30609's draft load, "type=DeepseekV3ForCausalLMNextN"
        ("LlamaForCausalLMEagle3", True),
        ("Qwen3NextForCausalLMMTP", True),
        ("DeepseekV4ForCausalLMDSpark", True),
        ("DFlashDraftModel", True),
        ("DeepseekV3ForCausalLM", False),
        ("LlamaForCausalLM", False),
        ("Qwen3MoeForCausalLM", False),
        ("MiMoForCausalLM", False),
    ],
)
def test_draft_architecture_by_name(name: str, draft: bool) -> None:
    assert is_draft_architecture(name) is draft
