"""The server-log counts of an end-to-end call: prefill work and adapter loads, those of the
measurements (from the server's first cache flush on) apart from start-up and warm-up."""

import json

from bench import server_log_counts
from tests.bench.call_files import write_call

LOG = """\
[2026-11-24 04:13:34] LoRA adapter 'a1': loaded weights for target modules ['o_proj', 'qkv_proj'].
[2026-11-24 04:13:34] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, token usage: 0.02
[2026-11-24 04:14:28] INFO:     127.0.0.1:43014 - "GET /flush_cache?timeout=60 HTTP/1.1" 200 OK
[2026-11-24 04:14:29] Prefill batch, #new-seq: 2, #new-token: 1500, #cached-token: 24, token usage: 0.00
[2026-11-24 04:14:30] LoRA adapter 'a2': loaded weights for target modules ['o_proj', 'qkv_proj'].
[2026-11-24 04:14:31] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 1343, token usage: 0.00
"""


def test_counts_split_at_the_first_flush():
    counts = server_log_counts.count(LOG.splitlines())
    assert counts == {"prefill_batches": 2, "new_tokens": 1501, "cached_tokens": 1367,
                      "adapter_loads_before_measuring": 1, "adapter_loads_while_measuring": 1}


def test_a_call_is_counted_per_server_of_its_results(tmp_path):
    results = {"run_id": "r", "date": "2026-11-24T04:12:33+00:00", "systems": {"vlora": {}, "nolora": {}},
               "setup": {"extra_server_args": ["--disable-radix-cache"]}, "device": "GPU", "platform": "Linux",
               "cpu_count": 16, "versions": {"sglang": "0.5.23"}, "code": {"revision": "a" * 40, "dirty": False}}
    results_path, logs_path = write_call(tmp_path, results, {"vlora.log": LOG, "other.log": LOG, "client/x.log": LOG})
    doc = server_log_counts.main([str(results_path), str(logs_path), "--out", str(tmp_path / "counts.json")])
    call = doc["calls"][0]
    assert list(call["servers"]) == ["vlora"]  # only the call's own systems' logs
    assert call["servers"]["vlora"]["new_tokens"] == 1501 and call["extra_server_args"] == ["--disable-radix-cache"]
    assert doc["provenance"]["git"] == {"commit": "a" * 40, "clean": True, "from": None}
    assert json.loads((tmp_path / "counts.json").read_text()) == doc
