"""bench/host_samples.py: py-spy raw samples to per-function host time against the floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.host_samples import compare, frame_name, scheduler_stacks

REPO = Path(__file__).resolve().parents[2]
SERVER = 'process 10:"python -m sglang.launch_server"'
SCHED = 'process 11:"python -c from multiprocessing.spawn import spawn_main"'
LOOP = ("run_scheduler_process (scheduler.py:6368);Scheduler.run_event_loop (scheduler.py:2010);"
        "Scheduler.event_loop_overlap (scheduler.py:2100)")


def line(thread: str, frames: str, count: int, process: str = SCHED) -> str:
    return f"{SERVER};{process};{thread};{frames} {count}"


def samples(forward: int, lora: int, wait: int) -> list[str]:
    main = "thread (0x1): MainThread"
    run = LOOP + ";Scheduler.run_batch (scheduler.py:4870);ModelRunner.forward (model_runner.py:1860)"
    out = [
        line(main, run + ";Linear.forward (linear.py:10)", forward),
        line(main, LOOP + ";Scheduler.process_batch_result (scheduler.py:5000);Tensor.tolist (<native>:1)", wait),
        # start-up (outside the event loop), another thread, the tokenizer process: not counted
        line(main, "run_scheduler_process (scheduler.py:6368);ModelRunner.__init__ (model_runner.py:100)", 999),
        line("thread (0x2): watchdog", LOOP + ";sleep (time.py:1)", 999),
        line(main, "TokenizerManager.handle_loop (tokenizer_manager.py:1)", 999,
             process='process 12:"python -c tokenizer"'),
    ]
    if lora:
        out.append(line(main, run + ";Linear.forward (linear.py:10);forward_with_base (backend.py:280)", lora))
    return out


def test_frame_names_drop_the_line() -> None:
    assert frame_name("Scheduler.run_batch (scheduler.py:4870)") == "Scheduler.run_batch (scheduler.py)"
    assert frame_name("<module> (<string>:1)") == "<module> (<string>)"


def test_only_the_scheduler_main_thread_inside_its_event_loop_counts() -> None:
    stacks = scheduler_stacks(samples(forward=40, lora=0, wait=10))
    assert sum(stacks.values()) == 50
    assert all(frames[0] == "Scheduler.run_event_loop (scheduler.py)" for frames in stacks)


def test_excess_over_the_floor_per_function_and_request() -> None:
    systems = {"nolora": scheduler_stacks(samples(forward=400, lora=0, wait=100)),
               "atmm": scheduler_stacks(samples(forward=400, lora=50, wait=100))}
    out = compare(systems, rate=500.0, requests=10, floor="nolora", top=10)
    floor, lora = out["systems"]["nolora"], out["systems"]["atmm"]
    assert floor["event_loop_ms"] == 100.0  # 500 samples / 500 Hz / 10 requests
    assert lora["event_loop_ms"] == 110.0
    over = lora["over_floor_ms"]
    assert over["forward_with_base (backend.py)"] == 10.0
    assert over["Scheduler.run_batch (scheduler.py)"] == 10.0
    assert over["Scheduler.process_batch_result (scheduler.py)"] == 0.0
    assert lora["top_self_ms"]["Tensor.tolist (<native>)"] == 20.0
    assert "over_floor_ms" not in floor


def test_command_line_writes_the_comparison(tmp_path: Path) -> None:
    for name, lora in (("nolora", 0), ("csgmv", 25)):
        (tmp_path / f"spy_{name}.txt").write_text("\n".join(samples(forward=100, lora=lora, wait=0)) + "\n")
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, "bench/host_samples.py", "--rate", "100", "--requests", "5", "--out", str(out),
                    f"nolora={tmp_path / 'spy_nolora.txt'}", f"csgmv={tmp_path / 'spy_csgmv.txt'}"], cwd=REPO, check=True,
                   capture_output=True)
    result = json.loads(out.read_text())
    assert result["systems"]["csgmv"]["over_floor_ms"]["forward_with_base (backend.py)"] == 50.0


def test_a_file_without_scheduler_samples_is_refused(tmp_path: Path) -> None:
    spy = tmp_path / "spy_nolora.txt"
    spy.write_text(line("thread (0x1): MainThread", "TokenizerManager.handle_loop (t.py:1)", 5) + "\n")
    run = subprocess.run([sys.executable, "bench/host_samples.py", "--rate", "100", "--requests", "5", f"nolora={spy}"],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode != 0 and "no scheduler event-loop samples for nolora" in run.stderr


def test_missing_files_and_bad_counts_are_refused(tmp_path: Path) -> None:
    for args, message in ((["--rate", "100", "--requests", "5", f"nolora={tmp_path / 'absent.txt'}"], "no such samples file"),
                          (["--rate", "100", "--requests", "5", "--top", "0", f"nolora={tmp_path / 'a.txt'}"],
                           "must be positive"),
                          (["--rate", "100", "--requests", "5", "nolora"], "expected NAME=FILE")):
        run = subprocess.run([sys.executable, "bench/host_samples.py", *args], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr, run.stderr


def module_samples() -> list[str]:
    """A layer's four linears, two of them LoRA-wrapped, with the line of each leaf."""
    main = "thread (0x1): MainThread"
    layer = LOOP + ";Scheduler.run_batch (scheduler.py:4870);Qwen2DecoderLayer.forward (qwen2.py:200)"
    attn, mlp = layer + ";Qwen2Attention.forward (qwen2.py:150)", layer + ";Qwen2MLP.forward (qwen2.py:90)"
    return [
        line(main, attn + ";ColumnParallelLinearWithLoRA.forward (layers.py:520);"
             "ATMMLoRABackend.forward_with_base (backend.py:519);lora_apply_static_in_gemm (atmm/ops.py:271)", 30),
        line(main, attn + ";ColumnParallelLinearWithLoRA.forward (layers.py:520);"
             "ATMMLoRABackend.forward_with_base (backend.py:519);lora_apply_static_in_gemm (atmm/ops.py:272)", 10),
        line(main, attn + ";RadixAttention.forward (radix_attention.py:100)", 50),  # attention itself: no module
        line(main, attn + ";RowParallelLinearWithLoRA.forward (layers.py:872);"
             "ATMMLoRABackend.forward_with_base (backend.py:519);lora_apply_static_in_gemm (atmm/ops.py:271)", 20),
        line(main, mlp + ";ColumnParallelLinear.forward (linear.py:400);UnquantizedLinearMethod.apply (unquant.py:614)", 15),
        line(main, mlp + ";RowParallelLinear.forward (linear.py:1400);UnquantizedLinearMethod.apply (unquant.py:614)", 5),
        # the vision encoder's attention has linears too: not a decoder module
        line(main, LOOP + ";Qwen2VisionBlock.forward (qwen2_vl.py:120);VisionAttention.forward (vision.py:300);"
             "ColumnParallelLinear.forward (linear.py:400);UnquantizedLinearMethod.apply (unquant.py:614)", 70),
    ]


def test_module_calls_name_each_linear_and_the_lines_that_hold_its_time() -> None:
    from bench.host_samples import module_calls

    calls = module_calls(scheduler_stacks(module_samples(), keep_lines=True), rate=100.0, requests=2)
    assert list(calls) == ["qkv", "o", "gate_up", "down"]
    assert calls["qkv"]["ms"] == 200.0  # 40 samples / 100 Hz / 2 requests
    assert calls["qkv"]["top_leaves_ms"] == {"lora_apply_static_in_gemm (atmm/ops.py:271)": 150.0,
                                             "lora_apply_static_in_gemm (atmm/ops.py:272)": 50.0}
    assert calls["o"]["ms"] == 100.0
    assert calls["gate_up"]["top_leaves_ms"] == {"UnquantizedLinearMethod.apply (unquant.py:614)": 75.0}
    assert calls["down"]["ms"] == 25.0


def test_stacks_without_lines_are_the_plain_stacks() -> None:
    from bench.host_samples import without_lines

    assert without_lines(scheduler_stacks(module_samples(), keep_lines=True)) == scheduler_stacks(module_samples())


def test_command_line_adds_module_calls(tmp_path: Path) -> None:
    spy = tmp_path / "spy_atmm.txt"
    spy.write_text("\n".join(module_samples()) + "\n")
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, "bench/host_samples.py", "--rate", "100", "--requests", "2", "--modules",
                    "--out", str(out), f"atmm={spy}"], cwd=REPO, check=True, capture_output=True)
    calls = json.loads(out.read_text())["systems"]["atmm"]["module_calls"]
    assert calls["o"]["top_leaves_ms"] == {"lora_apply_static_in_gemm (atmm/ops.py:271)": 100.0}
