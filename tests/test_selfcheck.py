"""`memfrac selfcheck` without a GPU: the no-device exit, the tolerance, deltas, the report, the libcudart finder."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from profiler import selfcheck as sc
from profiler.errors import MemfracError
from profiler.measurement import Snapshot


def _no_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# --- no CUDA device ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("json_out", [False, True])
def test_no_cuda_returns_2_with_one_line(monkeypatch, capsys, json_out):
    _no_cuda(monkeypatch)
    rc = sc.run_selfcheck(json_out=json_out)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "no CUDA device visible" in lines[0] and lines[0].startswith("memfrac selfcheck:")


def test_no_cuda_selfcheck_raises_a_memfrac_error(monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(sc.NoCudaDevice, match="no CUDA device visible") as ei:
        sc.selfcheck()
    assert isinstance(ei.value, MemfracError)


def test_device_index_not_visible(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert sc.run_selfcheck(device=3) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device 3 visible" in err and "sees 2" in err


def test_torch_missing_is_no_cuda(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    assert sc.run_selfcheck() == 2
    assert "torch is not installed" in capsys.readouterr().err


def test_cpu_only_torch_build(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in (sc.cuda_unavailable_reason() or "")


# --- tolerance and judging -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "tol"), [(512, 25.6), (256, 12.8), (-640, 32.0), (40, 2.0), (20, 2.0), (0, 2.0), (2, 2.0)]
)
def test_tolerance_is_5_percent_or_2_mib(size, tol):
    assert sc.tolerance_mib(size) == pytest.approx(tol)


def test_within():
    assert sc.within(514.0, 512.0, 25.6)
    assert sc.within(486.4, 512.0, 25.6)  # boundary counts
    assert not sc.within(486.3, 512.0, 25.6)
    assert sc.within(2.0, 0.0, 2.0) and sc.within(-2.0, 0.0, 2.0)
    assert not sc.within(2.01, 0.0, 2.0)
    assert not sc.within(None, 0.0, 2.0)  # no reading never passes


def test_judge_pass_and_fail():
    ok = sc.judge(
        "t", 512, {"driver": 520.0, "torch_reserved": 512.0, "non_torch": 8.0}, {"driver": 512, "non_torch": 0}
    )
    assert ok.passed and ok.tolerance_mib == pytest.approx(25.6) and ok.expected_mib == 512 and ok.note == ""
    bad = sc.judge(
        "c",
        256,
        {"driver": 256.0, "torch_reserved": 256.0, "non_torch": 0.0},
        {"driver": 256, "torch_reserved": 0, "non_torch": 256},
    )
    assert not bad.passed
    assert "torch_reserved +256.0 vs expected 0" in bad.note and "non_torch +0.0 vs expected +256.0" in bad.note
    missing = sc.judge("m", 0, {"driver": None}, {"driver": 0})
    assert not missing.passed and "driver no reading" in missing.note


def test_judge_extra_condition_and_nvml_note():
    c = sc.judge(
        "g", 0, {"driver": -4.0, "nvml": 30.0}, {"driver": -4.0}, also=(False, "memory went down during a capture")
    )
    assert not c.passed and "memory went down" in c.note
    assert "NVML Δ +30.0 differs from driver Δ -4.0 (informational)" in c.note
    # NVML alone never fails a check
    assert sc.judge("n", 512, {"driver": 512.0, "nvml": 0.0}, {"driver": 512.0}).passed


def test_deltas_from_hand_written_snaps():
    before = Snapshot(
        kind="gpu",
        t=0.0,
        free_mib=80_000.0,
        total_mib=81_559.0,
        torch_allocated_mib=100.0,
        torch_reserved_mib=120.0,
        torch_peak_allocated_mib=150.0,
        nvml_used_mib=1_000.0,
    )
    after = Snapshot(
        kind="gpu",
        t=1.0,
        free_mib=79_232.0,  # 768 MiB taken
        total_mib=81_559.0,
        torch_allocated_mib=612.0,
        torch_reserved_mib=632.0,  # 512 of it torch's
        torch_peak_allocated_mib=612.0,
        nvml_used_mib=1_768.0,
    )
    d = sc.deltas(before, after)
    assert d == {
        "driver": 768.0,
        "torch_reserved": 512.0,
        "torch_allocated": 512.0,
        "torch_peak_allocated": 462.0,
        "non_torch": 256.0,
        "nvml": 768.0,
    }
    host = Snapshot(kind="host", t=0.0, rss_mib=10.0)
    assert sc.deltas(host, host) == dict.fromkeys(d)  # no device layer: every reading None
    assert sc.deltas(before, after.__class__(**{**after.as_dict(), "nvml_used_mib": None}))["nvml"] is None


# --- report --------------------------------------------------------------------------------------------------


def _report() -> sc.SelfcheckReport:
    t1 = sc.judge(
        "torch tensor 512 MiB",
        512,
        {
            "driver": 512.0,
            "torch_reserved": 512.0,
            "torch_allocated": 512.0,
            "torch_peak_allocated": 512.0,
            "non_torch": 0.0,
            "nvml": None,
        },
        {"driver": 512.0, "torch_reserved": 512.0, "torch_allocated": 512.0, "non_torch": 0.0},
    )
    t2 = sc.judge(
        "cudaMalloc 256 MiB (non-torch)",
        256,
        {"driver": 258.0, "torch_reserved": 40.0, "torch_allocated": 0.0, "non_torch": 218.0, "nvml": 258.0},
        {"driver": 256.0, "torch_reserved": 0.0, "torch_allocated": 0.0, "non_torch": 256.0},
        note="via libcudart.so.13",
    )
    return sc.SelfcheckReport(
        device=0,
        device_name="NVIDIA H200",
        total_mib=143_771.0,
        torch_version="2.14.1+cu130",
        allocator="native",
        checks=[t1, t2],
        libcudart="/x/libcudart.so.13 (runtime 13000)",
    )


def test_render_text_table():
    r = _report()
    assert not r.passed
    text = sc.render_text(r)
    lines = text.splitlines()
    assert lines[0].startswith("memfrac selfcheck: GPU 0 (NVIDIA H200, 143,771 MiB), torch 2.14.1+cu130")
    assert "max(5% of the check's size, 2 MiB)" in lines[1]
    header = next(ln for ln in lines if ln.startswith("check"))
    for col in ("expected", "driver Δ", "reserved Δ", "allocated Δ", "peak alloc Δ", "non-torch Δ", "NVML Δ", "tol"):
        assert col in header
    row1 = next(ln for ln in lines if ln.startswith("torch tensor 512 MiB"))
    cells = ["512.0", "512.0", "512.0", "512.0", "(512.0)", "0.0", "-", "25.6", "pass"]
    assert row1.split() == ["torch", "tensor", "512", "MiB", *cells]
    row2 = next(ln for ln in lines if ln.startswith("cudaMalloc 256 MiB"))
    assert row2.split()[-8:] == ["258.0", "40.0!", "0.0", "-", "218.0!", "(258.0)", "12.8", "FAIL"]
    assert "cudaMalloc 256 MiB (non-torch): via libcudart.so.13; torch_reserved +40.0 vs expected 0" in text
    assert "libcudart: /x/libcudart.so.13" in text
    assert lines[-1] == "1/2 checks passed: FAILED"


def test_report_passes_only_with_checks_all_passed():
    r = _report()
    r.checks = r.checks[:1]
    assert r.passed and sc.render_text(r).endswith("1/1 checks passed: all pass")
    r.checks = []
    assert not r.passed


def test_as_dicts_is_json_list():
    d = json.loads(json.dumps(_report().as_dicts()))
    assert isinstance(d, list) and len(d) == 2
    assert set(d[0]) == {"name", "expected_mib", "measured_mib", "expected_by_layer", "tolerance_mib", "passed", "note"}
    assert d[1]["measured_mib"]["non_torch"] == 218.0 and d[1]["passed"] is False
    assert d[0]["measured_mib"]["nvml"] is None and d[0]["tolerance_mib"] == 25.6


@pytest.mark.parametrize(("pass_all", "rc"), [(True, 0), (False, 1)])
def test_run_selfcheck_exit_status_and_json(monkeypatch, capsys, pass_all, rc):
    r = _report()
    if pass_all:
        r.checks = r.checks[:1]
    monkeypatch.setattr(sc, "cuda_unavailable_reason", lambda device=0: None)
    monkeypatch.setattr(sc, "selfcheck", lambda device=0: r)
    assert sc.run_selfcheck() == rc
    assert "checks passed" in capsys.readouterr().out
    assert sc.run_selfcheck(json_out=True) == rc
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == [c.name for c in r.checks]


def test_guarded_turns_an_exception_into_a_failed_check():
    def boom() -> list[sc.Check]:
        raise sc.LibcudartNotFound("no CUDA runtime library (libcudart.so*) found: ...")

    (c,) = sc._guarded("cudaMalloc 256 MiB (non-torch)", boom, None)  # settling without torch is skipped
    assert not c.passed and c.note.startswith("could not measure: LibcudartNotFound: no CUDA runtime library")


# --- libcudart finder ----------------------------------------------------------------------------------------


def _isolate_finder(monkeypatch, dirs: list[Path]) -> None:
    monkeypatch.setattr(sc, "loaded_libcudart", lambda: None)
    monkeypatch.setattr(sc, "libcudart_search_dirs", lambda: dirs)
    monkeypatch.setattr(sc, "_system_libcudart", lambda: None)


def test_finder_names_what_it_looked_for(monkeypatch, tmp_path):
    a, b = tmp_path / "torch" / "lib", tmp_path / "nvidia" / "cu13" / "lib"
    b.mkdir(parents=True)
    (b / "libcudart_static.a").write_bytes(b"")  # a static archive is no shared library
    _isolate_finder(monkeypatch, [a, b])
    with pytest.raises(sc.LibcudartNotFound) as ei:
        sc.find_libcudart()
    msg = str(ei.value)
    assert isinstance(ei.value, MemfracError)
    assert "libcudart.so*" in msg and str(a) in msg and str(b) in msg
    assert "/proc/self/maps" in msg and "find_library('cudart')" in msg
    assert "nvidia-cuda-runtime" in msg and "CUDA_HOME" in msg


def test_finder_picks_the_runtime_matching_torch(monkeypatch, tmp_path):
    d = tmp_path / "lib"
    d.mkdir()
    for n in ("libcudart.so.12", "libcudart.so.13", "libcudart_static.a"):
        (d / n).write_bytes(b"")
    _isolate_finder(monkeypatch, [tmp_path / "missing", d])
    monkeypatch.setattr(sc, "_torch_cuda_major", lambda: "13")
    assert sc.find_libcudart() == d / "libcudart.so.13"
    monkeypatch.setattr(sc, "_torch_cuda_major", lambda: "12")
    assert sc.find_libcudart() == d / "libcudart.so.12"


def test_finder_prefers_the_loaded_runtime_then_the_system_one(monkeypatch, tmp_path):
    _isolate_finder(monkeypatch, [])
    monkeypatch.setattr(sc, "_system_libcudart", lambda: "libcudart.so.13")
    assert sc.find_libcudart() == Path("libcudart.so.13")
    monkeypatch.setattr(sc, "loaded_libcudart", lambda: tmp_path / "libcudart.so.13")
    assert sc.find_libcudart() == tmp_path / "libcudart.so.13"


def test_loaded_libcudart_reads_maps_and_skips_vendored_copies(tmp_path):
    plain, vendored = tmp_path / "libcudart.so.13", tmp_path / "libcudart.faf08d9a.so.13"
    plain.write_bytes(b"")
    vendored.write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 42 {vendored}\n"
        "7f01-7f02 rw-p 00000000 00:00 0\n"
        f"7f02-7f03 r-xp 00000000 08:01 43 {plain}\n"
        "7f03-7f04 r--p 00000000 08:01 44 /gone/libcudart.so.12 (deleted)\n"
    )
    assert sc.loaded_libcudart(str(maps)) == plain
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42 {vendored}\n")
    assert sc.loaded_libcudart(str(maps)) == vendored
    assert sc.loaded_libcudart(str(tmp_path / "no-such-maps")) is None


def test_search_dirs_cover_torch_and_the_runtime_wheels(monkeypatch, tmp_path):
    sp = tmp_path / "site-packages"
    (sp / "nvidia" / "cuda_nvrtc" / "lib").mkdir(parents=True)
    monkeypatch.setattr(sc.site, "getsitepackages", lambda: [str(sp)])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__file__=str(sp / "torch" / "__init__.py")))
    dirs = sc.libcudart_search_dirs()
    for want in (
        sp / "torch" / "lib",
        sp / "nvidia" / "cuda_runtime" / "lib",
        sp / "nvidia" / "cu13" / "lib",
        sp / "nvidia" / "cuda_nvrtc" / "lib",
        tmp_path / "cuda" / "lib64",
    ):
        assert want in dirs
    assert dirs.index(sp / "torch" / "lib") < dirs.index(sp / "nvidia" / "cu13" / "lib")
    assert len(dirs) == len(set(dirs))


def test_ladder_floor():
    # bs 64 × 256 rows × FFN 4096 × 2 bytes: the FFN activation the largest capture must hold at once
    assert sc.ladder_floor_mib(2) == 128.0


# --- the whole run against a simulated GPU -------------------------------------------------------------------
#
# A fake `torch` whose caching allocator keeps the books the way CUDA does (reserved ⊆ driver, graph pools inside
# reserved, empty_cache releases the default pool's free cache), so that the orchestration, the sign conventions
# and the expectations are exercised end to end without a GPU; and flawed variants to show each check can fail.

MiB = 1 << 20


class _Gpu:
    total = 80_000 * MiB

    def __init__(self, flaw: str = "") -> None:
        self.flaw = flaw
        self.allocated = self.reserved = self.non_torch = self.peak = self.peak_reserved = 0
        self.free_cache: dict[object, int] = {"default": 0}
        self.capturing: object | None = None

    def alloc(self, n: int) -> object:
        pool = self.capturing or "default"
        if pool != "default" and self.flaw == "graphs_outside_reserved":
            self.non_torch += n  # graph memory the allocator's stats do not see
            return "hidden"
        self.allocated += n
        cached = self.free_cache.setdefault(pool, 0)
        self.reserved += max(0, n - cached)
        self.free_cache[pool] = max(0, cached - n)
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return pool

    def release(self, n: int, pool: object) -> None:
        if pool == "hidden":
            return
        self.allocated -= n
        self.free_cache[pool] += n

    def empty_cache(self) -> None:
        self.reserved -= self.free_cache["default"]
        self.free_cache["default"] = 0


class _Tensor:
    def __init__(self, gpu: _Gpu, nbytes: int, rows: int = 0) -> None:
        self.gpu, self.nbytes, self.rows = gpu, nbytes, rows
        self.pool = gpu.alloc(nbytes)

    def __getitem__(self, sl: slice) -> _Tensor:
        view = object.__new__(_Tensor)
        view.gpu, view.nbytes, view.rows, view.pool = self.gpu, 0, sl.stop, None
        return view

    def element_size(self) -> int:
        return 2

    def __del__(self) -> None:
        if self.pool is not None:
            self.gpu.release(self.nbytes, self.pool)


def _fake_torch(gpu: _Gpu) -> types.SimpleNamespace:
    import contextlib

    class Graph:
        def replay(self) -> None:
            pass

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        gpu.empty_cache()
        gpu.capturing = id(pool if pool is not None else g)
        try:
            yield
        finally:
            gpu.capturing = None

    def reset_peak(dev=None) -> None:
        if gpu.flaw != "peak_reset_ignored":
            gpu.peak, gpu.peak_reserved = gpu.allocated, gpu.reserved

    stream = types.SimpleNamespace(wait_stream=lambda s: None)
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=lambda d: None,
        synchronize=lambda *a: None,
        empty_cache=gpu.empty_cache,
        mem_get_info=lambda d=None: (gpu.total - gpu.reserved - gpu.non_torch, gpu.total),
        memory_stats=lambda d=None: {
            "allocated_bytes.all.current": gpu.allocated,
            "reserved_bytes.all.current": gpu.reserved,
            "allocated_bytes.all.peak": gpu.peak,
            "reserved_bytes.all.peak": gpu.peak_reserved,
        },
        reset_peak_memory_stats=reset_peak,
        get_device_properties=lambda d: types.SimpleNamespace(name="FakeGPU", total_memory=gpu.total, uuid="0"),
        get_allocator_backend=lambda: "native",
        is_bf16_supported=lambda: True,
        Stream=lambda device=None: stream,
        current_stream=lambda: stream,
        stream=lambda s: contextlib.nullcontext(),
        CUDAGraph=Graph,
        graph=graph,
        graph_pool_handle=object,
    )
    return types.SimpleNamespace(
        __version__="fake",
        version=types.SimpleNamespace(cuda="13.0"),
        cuda=cuda,
        uint8="uint8",
        bfloat16="bf16",
        float16="fp16",
        no_grad=contextlib.nullcontext,
        empty=lambda n, dtype=None, device=None: _Tensor(gpu, n),
        zeros=lambda n, device=None: _Tensor(gpu, 4),
        randn=lambda rows, cols, device=None, dtype=None: _Tensor(gpu, rows * cols * 2, rows),
        tensor=lambda data, dtype=None: _Tensor(gpu, 0),
    )


class _FakeRuntime:
    def __init__(self, gpu: _Gpu) -> None:
        self.gpu, self.path, self.version, self.sizes = gpu, Path("/fake/libcudart.so.13"), 13000, {}

    def malloc(self, n: int) -> int:
        self.gpu.non_torch += n
        self.sizes[id(n)] = n
        return id(n)

    def free(self, ptr: int) -> None:
        if self.gpu.flaw != "cudafree_keeps_memory":
            self.gpu.non_torch -= self.sizes.pop(ptr)

    def synchronize(self) -> None:
        pass


def _fake_model(gpu: _Gpu):
    def model(x: _Tensor) -> _Tensor:
        h = _Tensor(gpu, x.rows * sc.FFN * 2)  # the FFN activation, freed inside the forward
        out = _Tensor(gpu, x.rows * sc.HIDDEN * 2)
        del h
        return out

    return model


def _run_fake(monkeypatch, flaw: str = "") -> sc.SelfcheckReport:
    gpu = _Gpu(flaw)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(gpu))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: that column reads "-"
    monkeypatch.setattr(sc, "find_libcudart", lambda: Path("/fake/libcudart.so.13"))
    monkeypatch.setattr(sc, "CudaRuntime", lambda path, device: _FakeRuntime(gpu))
    monkeypatch.setattr(sc, "_mlp", lambda torch, device, dtype: _fake_model(gpu))
    return sc.selfcheck(0)


def test_simulated_gpu_passes_every_check(monkeypatch):
    r = _run_fake(monkeypatch)
    assert r.passed, sc.render_text(r)
    names = [c.name for c in r.checks]
    assert names == [
        "idle: snapshot costs nothing",
        "torch tensor 512 MiB",
        "torch tensor 512 MiB freed",
        "cudaMalloc 256 MiB (non-torch)",
        "cudaFree 256 MiB",
        *(f"graph capture bs={bs}" for bs in sc.LADDER),
        "graph ladder total (7 graphs, replayed)",
        "reset_peaks drops a 512 MiB peak",
        "transient 256 MiB after reset",
    ]
    by = {c.name: c for c in r.checks}
    assert by["cudaMalloc 256 MiB (non-torch)"].measured_mib["non_torch"] == 256.0
    assert by["torch tensor 512 MiB freed"].measured_mib["driver"] == -512.0
    assert by["graph capture bs=64"].measured_mib["torch_reserved"] == 160.0  # 128 MiB activation + 32 MiB output
    assert by["graph ladder total (7 graphs, replayed)"].expected_mib == 160.0
    assert by["transient 256 MiB after reset"].measured_mib["torch_peak_allocated"] == 256.0
    assert r.libcudart == "/fake/libcudart.so.13 (runtime 13000)"


@pytest.mark.parametrize(
    ("flaw", "failing"),
    [
        (
            "graphs_outside_reserved",
            {*(f"graph capture bs={bs}" for bs in sc.LADDER), "graph ladder total (7 graphs, replayed)"},
        ),
        ("cudafree_keeps_memory", {"cudaFree 256 MiB"}),
        ("peak_reset_ignored", {"reset_peaks drops a 512 MiB peak", "transient 256 MiB after reset"}),
    ],
)
def test_simulated_flaws_fail_their_check(monkeypatch, flaw, failing):
    r = _run_fake(monkeypatch, flaw)
    assert not r.passed
    assert {c.name for c in r.checks if not c.passed} == failing, sc.render_text(r)
