#!/usr/bin/env python3
"""A test double for a worker process (supervision only: it measures nothing).

Invoked as `fake_sglang.py -m sglang.launch_server ...` in place of the interpreter. FAKE_BEHAVIOUR picks
what a real worker would do badly: `hang` (never ready, ignores SIGTERM), `oom-capture` (prints sglang's
capture-begin line and a CUDA OOM, exits 1), `crash-startup` (a traceback, exits 1), `serve-then-die`
(answers /health, then dies on the first /generate).
"""

import http.server
import json
import os
import signal
import sys
import time

behaviour = os.environ.get("FAKE_BEHAVIOUR", "hang")
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 0
probe_dir = os.environ.get("MEMFRAC_PROBE_DIR")


def probe(rec):
    if probe_dir:
        os.makedirs(probe_dir, exist_ok=True)
        with open(os.path.join(probe_dir, f"probe-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps({"v": 1, "pid": os.getpid(), "t": time.time(), **rec}) + "\n")


def log(msg):
    print(f"[2026-11-29 12:00:00 TP0] {msg}", flush=True)


if behaviour == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    probe({"type": "start", "kind": "gpu", "targets": []})
    probe({"type": "begin", "phase": "weights", "seq": 1, "kind": "gpu", "snap": {"free_mib": 80000.0}})
    log("Load weight begin. avail mem=78.12 GB")
    while True:
        time.sleep(1)
elif behaviour == "oom-capture":
    probe({"type": "start", "kind": "gpu", "targets": []})
    probe({"type": "begin", "phase": "decode_graph", "seq": 1, "kind": "gpu", "snap": {"free_mib": 1000.0}})
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=0.98 GB")
    log("Scheduler hit an exception: Traceback (most recent call last):")
    print(
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 120.00 MiB is free.",
        flush=True,
    )
    sys.exit(1)
elif behaviour == "crash-startup":
    probe({"type": "start", "kind": "gpu", "targets": []})
    probe({"type": "begin", "phase": "weights", "seq": 1, "kind": "gpu", "snap": {"free_mib": 80000.0}})
    log("Load weight begin. avail mem=78.12 GB")
    print("Traceback (most recent call last):\nRuntimeError: weight file is corrupt", flush=True)
    sys.exit(1)
elif behaviour == "ok":
    # a well-behaved worker: probe records for a few phases, /health, /server_info, /generate
    time.sleep(float(os.environ.get("FAKE_STARTUP_S", "0")))
    if os.environ.get("FAKE_NO_START") != "1":  # a worker whose probe did not load writes nothing at all
        probe({"type": "start", "kind": "gpu", "targets": []})
    # every window a worker of any role opens (profiler/measure/runner/classify.py needed_windows)
    for seq, (phase, before, after) in enumerate(
        [("baseline", 80000.0, 80000.0), ("weights", 80000.0, 64000.0), ("kv_pool", 64000.0, 10000.0),
         ("prefill_graph", 10000.0, 9800.0), ("decode_graph", 9800.0, 9000.0),
         ("disaggregation_init", 9000.0, 9000.0)], 1
    ):
        probe({"type": "begin", "phase": phase, "seq": seq, "kind": "gpu", "snap": {"free_mib": before}})
        probe(
            {
                "type": "end",
                "phase": phase,
                "seq": seq,
                "kind": "gpu",
                "before": {"free_mib": before},
                "after": {"free_mib": after},
                "details": {},
                "elapsed_s": 0.1,
            }
        )
    for i, bs in enumerate((8, 4, 2, 1)):
        probe(
            {"type": "ladder", "phase": "decode_graph", "bs": bs, "kind": "gpu", "snap": {"free_mib": 9600.0 - 200 * i}}
        )

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (
                {
                    "version": "0.5.23",
                    "max_total_num_tokens": 4096,
                    "max_running_requests": 4,
                    "chunked_prefill_size": 256,
                    "max_req_input_len": 1000,
                    "internal_states": [{"effective_max_running_requests_per_dp": 4}],
                }
                if self.path == "/server_info"
                else {}
            )
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        served = False

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(n) or b"{}")
            k = req.get("sampling_params", {}).get("max_new_tokens", 1)
            if not Ok.served:  # the serving window (the scheduler's run_batch hook)
                Ok.served = True
                snap = {"free_mib": 9000.0}
                probe({"type": "runtime", "kind": "gpu", "base": snap, "last": snap, "peak": snap, "batches": 1})
            ids = req.get("input_ids")
            out = {"output_ids": list(range(k))}
            # a batch of prompts (lists of ids) gets a list of outputs, as sglang's /generate answers one
            body = [out] * len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else out
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok).serve_forever()
elif behaviour == "serve-then-die":

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def do_POST(self):
            os._exit(3)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
