"""The GPU and its capacity from every clue a log's text gives (profiler.logs.gpu_evidence, identity._gpu).

Every clue line below is copied from a public source, cited beside it; the capacities are worked out by hand
(nvidia-smi's memory.total in MiB, what sglang's heuristic reads; GiB = MiB / 1024).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from profiler.core.measurement import Identity
from profiler.logs import parse_log
from profiler.logs.gpu_evidence import KINDS, gpu_clue
from profiler.model.gpus import gpu_from_instance, gpu_from_smi_name, log_gpus

# sglang-pr17246.log's first load line, and sglang-4417.log's (TP0)
LOAD_79 = "[2026-01-20 10:00:00] Load weight end. type=Qwen3ForCausalLM, avail mem=77.69 GB, mem usage=1.57 GB."
LOAD_4417 = ("[2025-03-14 07:39:13 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail "
             "mem=35.52 GB, mem usage=40.46 GB.")  # fmt: skip


@pytest.mark.parametrize(
    ("line", "kind", "name", "total"),
    [
        # python3 -m sglang.check_env, github.com/sgl-project/sglang/issues/10216: torch's device name, 8 GPUs
        ("GPU 0,1,2,3,4,5,6,7: NVIDIA H100 80GB HBM3", "check_env", "H100-80GB", 81559.0),
        # check_env, github.com/sgl-project/sglang/pull/965
        ("GPU 0,1,2,3,4,5,6,7: NVIDIA A100-SXM4-80GB", "check_env", "A100-80GB", 81920.0),
        # check_env, github.com/sgl-project/sglang/issues/6630
        ("GPU 0,1,2,3,4,5,6,7: NVIDIA H20", "check_env", "H20", 97871.0),
        # check_env, github.com/sgl-project/sglang/issues/8756: three T4s (15360 MiB)
        ("GPU 0,1,2: Tesla T4", "check_env", "T4", 15360.0),
        # nvidia-smi -L (search-index file id 44325266337): the UUID is not part of the name
        ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-e5f404f3-cc2a-cf0c-219f-dcf1a4e223f2)", "nvidia-smi -L", "H100-80GB",
         81559.0),
        # nvidia-smi table, name row: github.com/huggingface/text-generation-inference/issues/1692
        ("|   0  NVIDIA H100 80GB HBM3          On  | 00000000:84:00.0 Off |                    0 |", "nvidia-smi",
         "H100-80GB", 81559.0),
        # nvidia-smi table, memory cell (memory.total printed): github.com/RLinf/RLinf/issues/255
        ("| 30%   29C    P8             22W /  450W |     507MiB /  24564MiB |      0%      Default |",
         "nvidia-smi memory.total", None, 24564.0),
        # nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free (search-index file id 57510727102)
        ("0, NVIDIA A10G, 23028 MiB, 22403 MiB, 215 MiB", "nvidia-smi --query-gpu", "A10G", 23028.0),
        # rocminfo (search-index file id 57069008008): sglang reads Pool 1, 201310208 KB / 1024 = 196592 MiB
        ("  Marketing Name:          AMD Instinct MI300X", "rocminfo", "MI300X", 196592.0),
        # repo_unknown_grok1_8xH100.log line 25: the fused-MoE kernel-config file name
        ("Config file not found at /sgl-workspace/sglang/python/sglang/srt/layers/moe/fused_moe_triton/configs/"
         "triton_3_4_0/E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json.", "kernel-config path",
         "H100-80GB", 81559.0),
        # prose beside a log (github.com/didier-durand/llms-in-clouds docs/sglang.md): AWS g6 = NVIDIA L4
        ("EC2 instance of type [g6.12xlarge](https://aws.amazon.com/ec2/instance-types/g6/) EC2, featuring 4 x ",
         "instance type", "L4", 23034.0),
    ],
)  # fmt: skip
def test_each_clue_kind_on_a_real_line(line: str, kind: str, name: str | None, total: float) -> None:
    c = gpu_clue(7, line)
    assert c is not None and (c.kind, c.total_mib, c.line) == (kind, total, 7)
    assert (c.gpu.name if c.gpu else None) == name


@pytest.mark.parametrize(
    "line",
    [
        "GPU 0,1,2,3,4,5,6,7 Compute Capability: 9.0",  # check_env's next line (sglang#10216)
        # mineru-3418.log: torch's total, read by the failure parser (oom.py), not a clue
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total capacity of "
        "23.49 GiB of which 55.38 MiB is free.",
        # a MIG table's row (github.com/XuehaiPan/nvitop/pull/8): BAR1 "2MiB / 32767MiB" is not memory.total
        "|                  |      2MiB / 32767MiB |           |                       |",
        "[2025-03-08 12:29:26 TP0] Load weight end. type=Qwen2ForCausalLM, avail mem=6.09 GB, mem usage=15.54 GB.",
    ],
)
def test_lines_that_are_no_clue(line: str) -> None:
    assert gpu_clue(1, line) is None


def test_names_as_each_tool_prints_them() -> None:
    # check_env / torch ("NVIDIA A100 80GB PCIe", file id 67279305501), a kernel path's underscores, and case
    assert gpu_from_smi_name("NVIDIA A100 80GB PCIe").total_mib == 81920  # type: ignore[union-attr]
    assert gpu_from_smi_name("NVIDIA_H100_80GB_HBM3").name == "H100-80GB"  # type: ignore[union-attr]
    assert gpu_from_smi_name("nvidia geforce rtx 4090 d").name == "RTX-4090D"  # type: ignore[union-attr]
    assert gpu_from_smi_name("NVIDIA GeForce RTX 2080 Ti") is None  # not a known GPU (sglang#748)
    # an nvidia-smi name cut short matches only when every GPU it may be has one capacity
    assert gpu_from_smi_name("NVIDIA GeForce RTX 4090 ...").total_mib == 24564  # type: ignore[union-attr]
    assert gpu_from_smi_name("NVIDIA A100...") is None  # 40 GB or 80 GB
    assert gpu_from_instance("p4de.24xlarge").name == "A100-80GB"  # type: ignore[union-attr]
    assert gpu_from_instance("a3-highgpu-8g").name == "H100-80GB"  # type: ignore[union-attr]
    assert gpu_from_instance("m5.large") is None


def test_check_env_before_the_log_names_the_gpu_of_the_run() -> None:
    # sglang#10216's check_env line, then a run: the named H100 is read (81559 MiB), not the bound's estimate
    (m,) = parse_log(["Python: 3.12.11 (main, Jun  4 2025, 08:56:18) [GCC 11.4.0]",
                      "GPU 0,1,2,3,4,5,6,7: NVIDIA H100 80GB HBM3",
                      "GPU 0,1,2,3,4,5,6,7 Compute Capability: 9.0",
                      "[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=78.81 GB"])  # fmt: skip
    i = m.identity
    assert (i.gpu_name, i.gpu_total_mib, i.gpu_total_origin, i.gpu_count) == ("H100-80GB", 81559.0, "read", 8)
    assert i.gpu_total_how == "torch device name 'NVIDIA H100 80GB HBM3' (check_env, line 2) → H100-80GB 81559 MiB"


def test_an_environment_block_after_the_log_still_counts() -> None:
    # the issue template puts the environment after the log: the last run before it takes it
    (m,) = parse_log(["[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=78.81 GB",
                      "### Environment",
                      "GPU 0,1,2,3,4,5,6,7: NVIDIA A100-SXM4-80GB"])  # fmt: skip
    i = m.identity
    assert (i.gpu_name, i.gpu_total_mib, i.gpu_total_origin) == ("A100-80GB", 81920.0, "read")


def test_the_printed_memory_total_beats_the_name() -> None:
    # RLinf#255's nvidia-smi rows: the name row (RTX 4090) and the memory cell (memory.total 24564 MiB)
    (m,) = parse_log(["|   0  NVIDIA GeForce RTX 4090        Off |   00000000:4E:00.0 Off |                  Off |",
                      "| 30%   29C    P8             22W /  450W |     507MiB /  24564MiB |      0%      Default |",
                      "[2025-01-01 00:00:00] Load weight begin. avail mem=23.10 GB"])  # fmt: skip
    i = m.identity
    assert (i.gpu_name, i.gpu_total_mib, i.gpu_total_origin) == ("RTX-4090", 24564.0, "read")
    assert i.gpu_total_how == "nvidia-smi memory.total 24564 MiB ('507MiB / 24564MiB', line 2)"


def test_an_instance_type_the_free_memory_contradicts_is_not_used() -> None:
    # llms-in-clouds names g6.12xlarge (L4) and p5.48xlarge (H100) in one paragraph; the run starts with
    # 21.63 + 0.13 = 21.76 GiB free (repo_llms-in-clouds_qwq32b_4xL4.log): L4 23034 MiB = 22.49 GiB is 0.73 above
    # (read); H100 79.65 GiB is 57.89 above, more than max(3, 5% of 79.65 = 3.98): not this run's GPU
    (m,) = parse_log(["It runs on an EC2 instance of type g6.12xlarge instead of requiring an instance of type "
                      "p5.48xlarge, currently charged $31.5/h",
                      "[2025-03-08 12:29:11 TP0] Init torch distributed ends. mem usage=0.13 GB",
                      "[2025-03-08 12:29:12 TP0] Load weight begin. avail mem=21.63 GB"])  # fmt: skip
    assert (m.identity.gpu_name, m.identity.gpu_total_mib, m.identity.gpu_total_origin) == ("L4", 23034.0, "read")
    assert any("'p5.48xlarge'" in n and "not this run's GPU" in n for n in m.notes)


def test_a_named_gpu_smaller_than_the_free_memory_is_another_machines() -> None:
    # an RTX 4090 (24564 MiB = 23.99 GiB) cannot start with 78.81 GiB free: noted, and the bound estimates
    (m,) = parse_log(["GPU 0: NVIDIA GeForce RTX 4090",
                      "[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=78.81 GB"])  # fmt: skip
    assert (m.identity.gpu_total_mib, m.identity.gpu_total_origin) == (81559.0, "estimated")
    assert any("another machine's" in n for n in m.notes)


def test_a_gpu_not_in_the_table_is_said_and_the_memory_lines_decide() -> None:
    # sglang#748's check_env: a 2080 Ti (not a known GPU); 21.2 GiB free fits nothing within 3 GiB, and the
    # smallest GPU above it, A10/A10G (23028 MiB = 22.49 GiB), is 1.29 GiB above: 1.29 ≤ 3 → estimated 23028
    (m,) = parse_log(["GPU 0,1,2,3,4,5,6,7,8,9: NVIDIA GeForce RTX 2080 Ti",
                      "[2024-07-28 00:00:00] Load weight begin. avail mem=21.20 GB"])  # fmt: skip
    assert any("'NVIDIA GeForce RTX 2080 Ti'" in n and "not a known GPU" in n for n in m.notes)
    assert m.identity.gpu_total_origin == "estimated" and m.identity.gpu_total_mib == 23028.0


def test_a_bound_a_little_further_below_estimates_the_smallest_gpu_above_it() -> None:
    # sglang-4417.log (16 H100 over two nodes): 35.52 + 40.46 = 75.98 GiB at start; no GPU within 3 GiB above
    # (H100/H800 79.65 GiB is 3.67 above); 3.67 ≤ 5% × 79.65 = 3.98 → estimated 81559 MiB
    (m,) = parse_log([LOAD_4417])
    i = m.identity
    assert (i.gpu_name, i.gpu_total_mib, i.gpu_total_origin, i.gpu_candidates_mib) == (None, 81559.0, "estimated", [])
    assert i.gpu_total_how.startswith("avail mem after weights + their mem usage 75.98 GiB ≤ capacity: "
                                      "estimated 81559 MiB (H100-80GB / H100-PCIe / H800), the smallest GPU above "
                                      "it (3.67 GiB")  # fmt: skip


def test_a_bound_far_below_every_gpu_names_none() -> None:
    # repo_unknown_ornith-probe4.log: 24.12 + 17.17 = 41.29 GiB; L40S/L20 (44.99 GiB) is 3.70 above (> 3, and
    # > 5% × 44.99 = 2.25), RTX A6000 (47.99) 6.70 above (> 2.40): unknown, not a guess
    (m,) = parse_log(["Load weight end. elapsed=40.00 s, type=Qwen3_5ForConditionalGeneration, avail mem=24.12 GB, "
                      "mem usage=17.17 GB."])  # fmt: skip
    assert (m.identity.gpu_total_mib, m.identity.gpu_total_origin) == (None, "unknown")


def test_without_a_reading_at_start_the_bound_is_said() -> None:
    # sglang-pr11830.log: no weight lines; 40.03 GiB free after the pool bounds the GPU from below, nothing more
    (m,) = parse_log(["[2025-11-10 10:00:00] Memory pool end. avail mem=40.03 GB"])
    assert m.identity.gpu_total_origin == "unknown"
    assert any(n.startswith("GPU capacity unknown: at least 40.03 GiB, the largest free figure") for n in m.notes)


def test_a_run_without_clues_of_its_own_takes_the_files() -> None:
    # two starts in one file (a second server_args line), the nvidia-smi name row inside the second: the first
    # run takes it too (one machine wrote the file, as far as it shows), and says so
    runs = parse_log(["[2025-01-01 00:00:00] server_args=ServerArgs(model_path='a', tp_size=1)",
                      "[2025-01-01 00:00:01] Load weight begin. avail mem=78.81 GB",
                      "[2025-01-01 01:00:00] server_args=ServerArgs(model_path='b', tp_size=1)",
                      "|   0  NVIDIA H100 80GB HBM3          On  | 00000000:84:00.0 Off |                    0 |",
                      "[2025-01-01 01:00:01] Load weight begin. avail mem=78.81 GB"])  # fmt: skip
    assert [r.identity.gpu_total_mib for r in runs] == [81559.0, 81559.0]
    assert [r.identity.gpu_total_origin for r in runs] == ["read", "read"]
    assert any("GPU clues from elsewhere in this file (lines 4)" in n for n in runs[0].notes)


def test_gpus_of_different_sizes_the_smallest_counts() -> None:
    # sglang reads the minimum memory.total over the visible GPUs (get_nvgpu_memory_capacity)
    (m,) = parse_log(["0, NVIDIA H100 80GB HBM3, 81559 MiB", "1, NVIDIA A10G, 23028 MiB"])
    assert (m.identity.gpu_total_mib, m.identity.gpu_name) == (23028.0, "A10G")


def test_origin_of_a_capacity() -> None:
    assert Identity().gpu_total_origin == "unknown"
    assert Identity(gpu_total_mib=81559.0, gpu_total_how="nvidia-smi memory.total 81559 MiB").gpu_total_origin == "read"
    assert Identity(gpu_total_mib=1.0, gpu_total_how="oom total capacity").gpu_total_origin == "read"
    assert Identity(gpu_total_mib=1.0, gpu_total_how="first avail mem 15.15 GiB ≈ RTX-5080").gpu_total_origin == (
        "estimated"
    )


def test_every_kind_is_listed_and_every_log_gpu_is_sourced() -> None:
    from profiler.model.gpus import SOURCES

    assert len(KINDS) == len(set(KINDS)) == 8
    assert all(SOURCES[g.name] for g in log_gpus())


@given(st.text(max_size=300))
def test_any_line_gives_a_clue_or_none(text: str) -> None:
    c = gpu_clue(1, text)
    assert c is None or c.kind in KINDS


@given(st.integers(0, 200_000), st.integers(1, 300_000), st.integers(0, 99))
def test_an_nvidia_smi_memory_cell_reads_memory_total_exactly(used: int, total: int, temp: int) -> None:
    row = f"| N/A   {temp}C    P0             70W /  700W |   {used}MiB / {total}MiB |      0%      Default |"
    c = gpu_clue(3, row)
    assert c is not None and c.kind == "nvidia-smi memory.total" and c.total_mib == float(total)
