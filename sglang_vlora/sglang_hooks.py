"""Every SGLang touch point of sglang-vlora, in one table: what we touch, how, why, and our side.

* :data:`ARG_HOOKS`: hooks on argument parsing, registered in every process whether the plugin
  is on or not (the launcher must parse ``--plugin`` before it knows); bound to the plugin's
  ``turn_on``.
* :data:`ACTIVE_HOOKS`: hooks registered only when the plugin is on; bound to the process's
  :class:`~sglang_vlora.runtime.VLoRARuntime`.
* :data:`SERVER_POINTS`: everything else the server side uses: the LoRA backend registration,
  the routes added to SGLang's HTTP app, the CPU bridges (they replace torch functions), the
  SGLang functions we call and the attributes (private ones included) we read on SGLang's
  objects, and the values SGLang declares that we rely on.
* :data:`CLIENT_POINTS`: what the client helper (:mod:`sglang_vlora.frontend`) uses of SGLang's
  frontend library; checked by the tests, not at server start-up.

At start-up (:func:`sglang_vlora.plugin.activate`) :func:`~sglang_vlora.touch_points.check`
checks the hooks and :data:`SERVER_POINTS` against the installed SGLang (targets, leading
parameters, attributes) and stops with an error naming what moved and the pinned SGLang
version; after SGLang applies the hooks, :func:`~sglang_vlora.touch_points.verify_applied`
checks that each is in place (SGLang only logs a hook whose target does not resolve).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_vlora import arg_hooks, guard_hooks
from sglang_vlora.heads import head_hooks
from sglang_vlora.modes import mode_hooks
from sglang_vlora.orchestrator import scheduler_hooks
from sglang_vlora.touch_points import Hook, TouchPoint

LORA_MANAGER = "sglang.srt.lora.lora_manager.LoRAManager"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
COMMON = "sglang.srt.utils.common"
BACKEND = "sglang.srt.lora.backend.base_backend.BaseLoRABackend"

# --------------------------------------------------------------------- arg hooks
ARG_HOOKS: list[Hook] = [
    Hook(
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        HookType.AFTER,
        arg_hooks.add_cli_args_after,
        "SGLang has no API for plugin flags: add --plugin and --vlora-*, offer 'atmm'.",
        ("parser",),
    ),
    Hook(
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        HookType.AROUND,
        arg_hooks.from_cli_args_around,
        "from_cli_args drops unknown fields: read ours here, turn the plugin on, "
        "fill LoRA and CPU defaults, and hand our options to children via the environment.",
        ("cls", "args"),
    ),
]

# ------------------------------------------------------------------ active hooks
_HEAD_HOOKS = [
    Hook(
        f"{TOKENIZER_MANAGER}._validate_and_resolve_lora",
        HookType.AROUND,
        guard_hooks.validate_requests_around,
        "refuse (400) input SGLang's scheduler would crash on (empty prompt, ids outside the "
        "vocabulary), head requests whose adapter has no such head and malformed application / "
        "SLO fields; finish head requests after prefill",
        ("self", "obj"),
    ),
    Hook(
        f"{LORA_MANAGER}.validate_new_adapter",
        HookType.AFTER,
        head_hooks.load_heads_after_validate,
        "SGLang drops non-LoRA tensors from adapter files: load the task heads beside them, "
        "inside SGLang's load error handling so a bad head fails the load with its reason",
        ("self", "lora_config", "lora_ref"),
    ),
    Hook(
        f"{LORA_MANAGER}.load_lora_adapter",
        HookType.AFTER,
        head_hooks.drop_heads_after_load,
        "forget the heads of an adapter whose load failed",
        ("self", "lora_ref"),
    ),
    Hook(
        f"{LORA_MANAGER}.unload_lora_adapter",
        HookType.AFTER,
        head_hooks.drop_heads_after_unload,
        "forget the heads of an unloaded adapter",
        ("self", "lora_ref"),
    ),
    Hook(
        "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
        HookType.AFTER,
        head_hooks.mark_head_requests_after_init,
        "carry each request's head task from the schedule batch to the forward (in the runtime)",
        ("cls", "batch"),
    ),
    Hook(
        "sglang.srt.layers.logits_processor.LogitsProcessor.forward",
        HookType.AROUND,
        head_hooks.logits_forward_around,
        "answer head requests from the last prompt token's final hidden state, in the same forward",
        ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"),
    ),
    Hook(
        f"{TOKENIZER_MANAGER}.update_request_meta_info",
        HookType.AROUND,
        head_hooks.skip_empty_answers_around,
        "SGLang pads customized_info with nulls for every request of a batch that held a head "
        "request: only head requests get meta_info.vlora_head",
        ("self", "meta_info", "state", "customized_info", "index"),
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
        HookType.AROUND,
        head_hooks.chat_head_check_around,
        "a streamed chat completion asking for a head answered with the language model's token: refuse it",
        ("self", "request"),
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request",
        HookType.AROUND,
        head_hooks.completion_head_check_around,
        "a text completion asking for a head answered with the language model's token: refuse it",
        ("self", "request"),
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._decode_response",
        HookType.AROUND,
        head_hooks.head_label_as_text_around,
        "OpenAI chat completions: a head answer's message text is its label",
        ("self", "ret_item"),
    ),
]

_GUARD_HOOKS = [
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments",
        HookType.AROUND,
        guard_hooks.normalize_request_around,
        "a single prompt's list lora_path or return_hidden_states stopped the scheduler process; a list "
        "rid or sampling_params, empty sampling params, \"n\": null, an unknown session_params field and "
        "a batch's short lora_path, modalities or custom_logit_processor list were 500s: all 400s",
        ("self",),
    ),
    Hook(
        f"{TOKENIZER_MANAGER}.create_abort_task",
        HookType.AROUND,
        guard_hooks.abort_task_around,
        "a streamed request refused before SGLang registered it made the stream's abort task raise "
        "2 s later, and uvicorn closed the connection, cutting the next answer on it: skip the task "
        "for such a request",
        ("self", "obj"),
    ),
    Hook(
        f"{TOKENIZER_MANAGER}._release_lora_once",
        HookType.AROUND,
        guard_hooks.release_lora_around,
        "a request refused before its adapters' use was counted (an unknown adapter, our checks) "
        "has no lora_id, and SGLang's release logged a traceback for each: skip the release",
        ("self", "state"),
    ),
    Hook(
        f"{TOKENIZER_MANAGER}.start_profile",
        HookType.AROUND,
        guard_hooks.start_profile_around,
        "/start_profile handed its fields to the scheduler unchecked: activities RPD (without AMD's "
        "tracer), GPU, MEM or CUDA_PROFILER on a server without CUDA, and a trace folder that cannot be "
        "created stopped the server; an unknown activity recorded nothing: all 400s",
        ("self", "req"),
    ),
    Hook(
        f"{TOKENIZER_MANAGER}._execute_profile",
        HookType.AROUND,
        guard_hooks.profile_result_around,
        "the scheduler's failed answer to a profile request was a 500 with a traceback: its message, with "
        "400 for none to stop, 409 for one already running, 500 for a profiler that failed",
        ("self", "req"),
    ),
    Hook(
        "sglang.srt.entrypoints.api_contract.generate_contract_error",
        HookType.AROUND,
        guard_hooks.contract_error_around,
        "SGLang's /generate schema errors do not name the field: name it",
        ("body",),
    ),
    Hook(
        f"{COMMON}._load_image",
        HookType.AROUND,
        guard_hooks.load_image_around,
        "Pillow's decompression-bomb error on an image's header reached the client as a 500: a 400",
        (),
    ),
    Hook(
        f"{COMMON}._fully_load_pil_image",
        HookType.AROUND,
        guard_hooks.image_size_around,
        "refuse (400) an image above --vlora-max-image-pixels before its pixels are decoded",
        ("image",),
    ),
    Hook(
        "sglang.srt.utils.auth.decide_request_auth",
        HookType.AROUND,
        guard_hooks.decide_auth_around,
        "SGLang's auth levels have no 'any configured key' level: /vlora/status reads with either key",
        ("method", "path", "authorization_header", "api_key", "admin_api_key", "auth_level"),
    ),
    Hook(
        f"{LORA_MANAGER}._load_lora_adapter",
        HookType.AROUND,
        guard_hooks.check_adapter_load_around,
        "SGLang loads an adapter whose tensors do not fit the model (or hold NaN) and crashes on "
        "the first request that uses it: check the package first, a failed load says why",
        ("self", "lora_ref"),
    ),
    Hook(
        f"{LORA_MANAGER}._load_lora_adapter_from_tensors",
        HookType.AROUND,
        guard_hooks.check_tensor_load_around,
        "the same check for an adapter sent as tensors (/load_lora_adapter_from_tensors)",
        ("self", "lora_ref", "tensors", "config_dict"),
    ),
    Hook(
        f"{LORA_MANAGER}.init_lora_shapes",
        HookType.AROUND,
        guard_hooks.served_targets_around,
        "--lora-target-modules all adds embed_tokens and lm_head, which atmm does not serve: "
        "serve the linear modules and say so instead of stopping at start",
        ("self", "max_lora_rank", "target_modules"),
    ),
]

_MODE_HOOKS = [
    Hook(
        f"{LORA_MANAGER}.__init__",
        HookType.AFTER,
        mode_hooks.lora_manager_init_after,
        "one mode controller per scheduler, over the LoRA-targeted base weights",
        ("self",),
    ),
    Hook(
        f"{LORA_MANAGER}.load_lora_adapter",
        HookType.AFTER,
        mode_hooks.compile_switch_after_load,
        "compile the switch kernels of a newly loaded adapter's rank in the load, not at its first merge",
        ("self", "lora_ref"),
    ),
    Hook(
        "sglang.srt.lora.mem_pool.LoRAMemoryPool.prepare_lora_batch",
        HookType.BEFORE,
        mode_hooks.keep_merged_resident_before,
        "the merged adapter's pool slot feeds the mixture (-k) items: never evict it",
        ("self", "cur_uids"),
    ),
    Hook(
        f"{LORA_MANAGER}.prepare_lora_batch",
        HookType.AFTER,
        mode_hooks.no_work_no_lora_after,
        "SGLang counts a batch as LoRA-active when a request names an adapter; with an adapter "
        "merged its requests need no LoRA work and base requests need its -k items: a batch is "
        "active when it has work items, and an inactive one runs the base layers alone",
        ("self", "forward_batch"),
    ),
    Hook(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner._resolve_lora_variant",
        HookType.AROUND,
        mode_hooks.lora_graph_if_work_around,
        "SGLang replays its base-only decode graph for batches naming no adapter: replay it for "
        "batches without LoRA work instead (merged requests: base-only; base requests with an "
        "adapter merged: the LoRA graph)",
        ("self", "forward_batch"),
    ),
    Hook(
        f"{LORA_MANAGER}.validate_lora_batch",
        HookType.AROUND,
        mode_hooks.count_merged_around,
        "admission counts the merged adapter's pool slot, so the pool never runs out of slots",
        ("self", "lora_ids"),
    ),
    Hook(
        f"{LORA_MANAGER}.unload_lora_adapter",
        HookType.AROUND,
        mode_hooks.unload_around,
        "refuse to unload the merged adapter; forget the factors of an unloaded one",
        ("self", "lora_ref"),
    ),
    Hook(
        "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin._unload_lora_adapter_locked",
        HookType.AROUND,
        mode_hooks.refuse_unloading_merged_around,
        "refuse (400) to unload the merged adapter before SGLang forgets its name",
        ("self", "obj"),
    ),
    Hook(
        f"{SCHEDULER}.__init__",
        HookType.AFTER,
        mode_hooks.bind_scheduler_after,
        "a merge may take a pool slot only if running requests do not hold them all: the "
        "controller reads the scheduler's running requests",
        ("self",),
    ),
    Hook(
        f"{SCHEDULER}.handle_rpc_request",
        HookType.AROUND,
        mode_hooks.rpc_around,
        "mode changes and status reach every TP rank's scheduler between forward passes",
        ("self", "recv_req"),
    ),
    Hook(
        "sglang.srt.entrypoints.engine.Engine._launch_subprocesses",
        HookType.AFTER,
        mode_hooks.launch_subprocesses_after,
        "the HTTP server has no API for new routes or the RPC socket: add /vlora/mode, /vlora/status",
        ("cls",),
    ),
]

_ORCHESTRATOR_HOOKS = [
    Hook(
        f"{SCHEDULER}.get_next_batch_to_run",
        HookType.AROUND,
        scheduler_hooks.get_next_batch_around,
        "SGLang has no policy registry: decide mode and batch, and switch weights, "
        "between forward passes before SGLang picks the next batch",
        ("self",),
    ),
    Hook(
        f"{SCHEDULER}.can_schedule_lora_req",
        HookType.AROUND,
        scheduler_hooks.can_schedule_around,
        "admit only the waiting requests the policy chose",
        ("self", "req", "running_loras"),
    ),
    Hook(
        f"{SCHEDULER}.run_batch",
        HookType.BEFORE,
        scheduler_hooks.run_batch_before,
        "count each batch under the mode it runs in and time it (measured cost model)",
        ("self", "batch"),
    ),
]

ACTIVE_HOOKS: list[Hook] = _HEAD_HOOKS + _GUARD_HOOKS + _MODE_HOOKS + _ORCHESTRATOR_HOOKS

# ------------------------------------------------- registrations, routes, bridges
_REGISTRATIONS = [
    TouchPoint(
        "registration", "sglang.srt.lora.backend.lora_registry.register_lora_backend",
        "SGLang's LoRA backend registry: add 'atmm' (the factory hands the runtime to the backend)",
        "plugin._register_backend", params=("name",),
    ),
    TouchPoint(
        "registration", BACKEND,
        "the atmm backend subclasses it; SGLang's LoRA manager reads batch_info and calls the methods",
        "backend.ATMMLoRABackend", params=("max_loras_per_batch", "device"),
        attrs=("batch_info", "max_loras_per_batch", "device", "skip_inactive_dense_lora"),
    ),
    TouchPoint(
        "call", f"{BACKEND}.prepare_lora_batch", "SGLang calls our override before every forward",
        "backend.ATMMLoRABackend.prepare_lora_batch",
        params=("self", "forward_batch", "weight_indices", "lora_ranks", "scalings",
                "use_decode_cuda_graph", "use_prefill_cuda_graph"),
    ),
    TouchPoint(
        "call", f"{BACKEND}.forward_with_base", "graph batches take our fused base + shrink path; "
        "the rest goes to SGLang's (we read its all_reduce, kind and pruned_batch_info arguments)",
        "backend.ATMMLoRABackend.forward_with_base",
        params=("self", "layer", "x", "base_fn", "lora_a", "lora_b", "output_offset", "offsets",
                "all_reduce", "kind", "pruned_batch_info"),
    ),
    TouchPoint("call", f"{BACKEND}.run_lora_a_sgemm", "shrink: x A^T per work item",
               "backend.ATMMLoRABackend.run_lora_a_sgemm", params=("self", "x", "weights")),
    TouchPoint("call", f"{BACKEND}.run_lora_b_sgemm", "expand: . B^T, scaled, into the base output",
               "backend.ATMMLoRABackend.run_lora_b_sgemm", params=("self", "x", "weights")),
    TouchPoint("call", f"{BACKEND}.run_qkv_lora", "q/k/v as three slices",
               "backend.ATMMLoRABackend.run_qkv_lora", params=("self", "x", "qkv_lora_a", "qkv_lora_b")),
    TouchPoint("call", f"{BACKEND}.run_gate_up_lora", "gate/up as two slices",
               "backend.ATMMLoRABackend.run_gate_up_lora", params=("self", "x", "gate_up_lora_a", "gate_up_lora_b")),
    TouchPoint("call", f"{BACKEND}.init_decode_cuda_graph_batch_info", "size the static work items once",
               "backend.ATMMLoRABackend.init_decode_cuda_graph_batch_info",
               params=("self", "max_bs_in_cuda_graph", "num_tokens_per_req")),
    TouchPoint("call", f"{BACKEND}.validate_lora_targets", "refuse embed_tokens / lm_head",
               "backend.ATMMLoRABackend.validate_lora_targets", params=("self", "base_model", "target_modules")),
    TouchPoint(
        "read", "sglang.srt.lora.utils.LoRABatchInfo", "SGLang's view of a batch, built by the backend",
        "backend.ATMMLoRABackend",
        attrs=("use_cuda_graph", "bs", "num_segments", "seg_indptr", "weight_indices", "lora_ranks",
               "scalings", "max_len", "seg_lens", "expected_tokens", "has_active_lora"),
    ),
    TouchPoint("read", "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest", "whether a chat "
               "completion is streamed and asks for a head", "heads.head_hooks.chat_head_check_around",
               attrs=("stream", "custom_params")),
    TouchPoint("read", "sglang.srt.entrypoints.openai.protocol.CompletionRequest", "whether a text completion "
               "asks for a head", "heads.head_hooks.completion_head_check_around", attrs=("stream", "custom_params")),
    TouchPoint("read", f"{TOKENIZER_MANAGER}.create_abort_task", "the stream's abort task reads the request's "
               "is_single and rids after the stream: the guard runs it only where they can name registered "
               "requests", "guard_hooks.abort_task_around", source_has=("is_single", "rid_to_state")),
    TouchPoint("read", "sglang.srt.managers.io_struct.GenerateReqInput", "a request whose lora_id is unset "
               "never had its adapters' use counted", "guard_hooks.release_lora_around", attrs=("lora_id",)),
    TouchPoint("read", "sglang.srt.managers.tokenizer_manager.ReqState", "the request a state is of",
               "guard_hooks.release_lora_around", attrs=("obj",)),
    TouchPoint("read", "sglang.srt.managers.io_struct.ProfileReq", "the profile request's fields the check "
               "reads, and the activities it sets for a request naming none", "guard_hooks.start_profile_around",
               attrs=("activities", "num_steps", "start_step", "output_dir")),
    TouchPoint("read", f"{TOKENIZER_MANAGER}._execute_profile", "a refused profile request raises RuntimeError "
               "with the scheduler's message", "guard_hooks.profile_result_around",
               source_has=("result.success", "RuntimeError(result.message)")),
    TouchPoint("read", "sglang.srt.managers.io_struct.SessionParams", "a request's session_params must name "
               "its fields (an unknown one was a 500)", "guard_hooks.normalize_request_around",
               attrs=("__struct_fields__",)),
    TouchPoint("call", "sglang.srt.lora.utils.generate_sequence_lengths", "tokens per request of a forward batch",
               "backend.ATMMLoRABackend._prepare", params=("forward_batch", "device")),
]

_ROUTES = [
    TouchPoint(
        "route", "sglang.srt.entrypoints.http_server.app", "SGLang's FastAPI app has no API for plugin "
        "routes: POST /vlora/mode and GET /vlora/status are added to it", "http_api.add_routes",
        attrs=("add_api_route",),
    ),
    TouchPoint(
        "route", "sglang.srt.entrypoints.http_server.app", "SGLang's 400 for a body that fails validation ends "
        "with the endpoint's source file and line, and a chat body its validators cannot read was a 500: "
        "its validation handler is wrapped and answers those crashes too",
        "http_errors.install", attrs=("exception_handlers", "add_exception_handler"),
    ),
    TouchPoint("route", "sglang.srt.utils.auth.auth_level", "/vlora/mode carries SGLang's own admin auth level",
               "http_api.add_routes", params=("level",)),
    TouchPoint("route", "sglang.srt.utils.auth.AuthLevel", "the level of SGLang's /load_lora_adapter",
               "http_api.add_routes", attrs=("ADMIN_OPTIONAL",)),
    TouchPoint("route", "sglang.srt.utils.auth.AuthDecision", "the answer of the auth hook for /vlora/status",
               "guard_hooks.decide_auth_around", attrs=("allowed",)),
    TouchPoint("call", "sglang.srt.utils.network.get_zmq_socket", "connect to the scheduler's RPC socket",
               "http_api.SchedulerRPC", params=("context", "socket_type", "endpoint", "bind")),
    TouchPoint("call", "sglang.srt.managers.io_struct.sock_send", "send an RPC", "http_api.SchedulerRPC.call",
               params=("socket", "obj")),
    TouchPoint("call", "sglang.srt.managers.io_struct.sock_recv", "receive its answer", "http_api.SchedulerRPC.call",
               params=("socket",)),
    TouchPoint("call", "sglang.srt.managers.io_struct.RpcReqInput", "an RPC to the scheduler",
               "http_api.SchedulerRPC.call, mode_hooks.rpc_around", attrs=("method", "parameters")),
    TouchPoint("call", "sglang.srt.managers.io_struct.RpcReqOutput", "the scheduler's answer",
               "mode_hooks.rpc_around, http_api.SchedulerRPC.call", attrs=("success", "message")),
    TouchPoint("read", "sglang.srt.server_args.PortArgs", "_launch_subprocesses returns the ports, RPC included",
               "mode_hooks.launch_subprocesses_after", attrs=("rpc_ipc_name",)),
]

# Checked before the CPU bridges run (they use it); the rest once the bridges are in place
# (resolving SGLang's engine modules imports sgl_kernel).
CPU_BRIDGE_POINTS = [
    TouchPoint(
        "bridge", f"{COMMON}.is_cpu", "SGLang picks its CPU platform from SGLANG_USE_CPU_ENGINE=1, read "
        "once and cached: we set it and clear the cache", "cpu_compat.select_cpu_engine",
        attrs=("cache_clear",), source_has=("SGLANG_USE_CPU_ENGINE",),
    ),
]

_BRIDGES = [
    TouchPoint("bridge", "sgl_kernel", "SGLang imports it at module level in every process; on a CPU an "
               "import-only stand-in replaces it (cpu_compat/sgl_kernel_stub)", "cpu_compat.install_sgl_kernel_stub"),
    TouchPoint("bridge", "torch.Tensor.pin_memory", "SGLang's LoRA code pins host memory unconditionally, "
               "which fails without a GPU: a no-op on CPU", "cpu_compat.disable_pinning"),
    TouchPoint("bridge", "torch.tensor", "the same for torch.tensor(..., pin_memory=True)", "cpu_compat.disable_pinning"),
    TouchPoint("value", "sglang.srt.plugins.GENERAL_PLUGINS_GROUP", "the entry-point group SGLang loads "
               "plugins from (pyproject.toml declares ours in it)", "pyproject.toml, server_process",
               expected="sglang.srt.plugins"),
]

# ---------------------------------------------- what we read on SGLang's objects
_ARG_READS = [
    TouchPoint("read", "argparse.ArgumentParser", "argparse has no API to change an added option: we "
               "append 'atmm' to --lora-backend's choices and reset its default (private _actions)",
               "arg_hooks.add_cli_args_after", attrs=("_actions",)),
    TouchPoint(
        "value", "sglang.srt.server_args.ServerArgs", "SGLang's default --lora-backend, restored when the "
        "plugin is off (read from its field default, not copied); the flags the plugin fills in",
        "arg_hooks._sglang_default_lora_backend, plugin.apply_server_defaults",
        attrs=("lora_backend", "enable_lora", "device", "attention_backend", "mm_attention_backend",
               "sampling_backend", "disable_overlap_schedule", "sleep_on_idle", "cuda_graph_backend_decode",
               "cuda_graph_backend_prefill", "max_total_tokens", "pp_size", "enable_dp_attention",
               "max_loras_per_batch", "enable_metrics"),
    ),
]

_SCHEDULER_READS = [
    TouchPoint(
        "read", SCHEDULER, "the orchestrator reads the queues and capacity; the controller the running "
        "requests", "orchestrator.runtime.Orchestrator, modes.controller.ModeController.busy_uids",
        attrs=("waiting_queue", "running_batch", "last_batch", "chunked_req", "enable_lora", "server_args",
               "max_running_requests", "tp_worker", "device", "enable_overlap", "forward_stream"),
    ),
    TouchPoint("read", "sglang.srt.managers.schedule_batch.ScheduleBatch", "requests and work of a batch",
               "orchestrator.runtime", attrs=("reqs", "forward_mode", "extend_num_tokens", "decoding_reqs", "batch_size")),
    TouchPoint("read", "sglang.srt.managers.schedule_batch.NextBatchPlan", "whether a step has a batch",
               "orchestrator.runtime.Orchestrator.after_schedule", attrs=("batch_to_run",)),
    TouchPoint("read", "sglang.srt.managers.schedule_batch.Req", "a request's adapter, tokens and parameters",
               "orchestrator.runtime, modes.controller, heads.head_hooks",
               attrs=("rid", "lora_id", "sampling_params", "origin_input_ids", "output_ids", "kv", "finished")),
    TouchPoint("read", "sglang.srt.managers.schedule_batch.ReqKvInfo", "prefilled tokens of a running request",
               "orchestrator.runtime.Orchestrator._request", attrs=("kv_committed_len",)),
    TouchPoint("read", "sglang.srt.sampling.sampling_params.SamplingParams", "output cap; our request fields",
               "orchestrator.runtime, heads.head_hooks", attrs=("max_new_tokens", "custom_params")),
    TouchPoint("read", "sglang.srt.model_executor.forward_batch_info.ForwardMode", "prefill or decode",
               "orchestrator.runtime, modes.controller, heads.head_hooks", attrs=("is_extend",)),
    TouchPoint("read", "sglang.srt.managers.tp_worker.TpModelWorker", "the model runner of a scheduler",
               "orchestrator.runtime", attrs=("model_runner",)),
    TouchPoint("read", "sglang.srt.model_executor.model_runner.ModelRunner", "its LoRA manager and decode graphs",
               "orchestrator.runtime", attrs=("lora_manager", "decode_cuda_graph_runner")),
    TouchPoint("read", "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner",
               "the largest decode CUDA graph caps the planned batch; the base-only graph's variant "
               "reads the LoRA manager", "orchestrator.runtime._capacity, modes.mode_hooks",
               attrs=("max_bs", "model_runner")),
    TouchPoint("call", "sglang.srt.runtime_context.get_parallel", "TP rank, size and group of this scheduler",
               "orchestrator.runtime.Orchestrator", params=()),
    TouchPoint("read", "sglang.srt.runtime_context._parallel_fields", "TP rank 0 decides for every rank: "
               "the names get_parallel() answers are listed by this private function",
               "orchestrator.runtime.Orchestrator", listed=("tp_size", "tp_group", "tp_rank")),
    TouchPoint("read", "sglang.srt.distributed.parallel_state.GroupCoordinator", "the TP CPU group",
               "orchestrator.runtime.Orchestrator._broadcast", attrs=("ranks", "rank_in_group", "cpu_group")),
    TouchPoint("call", "sglang.srt.utils.broadcast_pyobj", "rank 0's decision to every TP rank",
               "orchestrator.runtime.Orchestrator._broadcast", params=("data", "rank", "dist_group", "src")),
]

_LORA_READS = [
    TouchPoint(
        "read", LORA_MANAGER, "the adapters, pool and LoRA layers the controller switches; the load checks",
        "modes.controller.ModeController, guard_hooks, heads.head_hooks",
        attrs=("lora_modules", "memory_pool", "loras", "lora_refs", "lora_backend", "fetch_new_loras",
               "create_lora_update_result", "base_hf_config", "device", "max_lora_rank", "target_modules"),
    ),
    TouchPoint("read", LORA_MANAGER, "the pool and layers laid out for the shrink inside the base GEMM",
               "in_gemm_weights", attrs=("memory_pool", "attn_tp_size", "update_lora_info")),
    TouchPoint("call", f"{LORA_MANAGER}.update_lora_info", "point the LoRA layers at the pool's new A views",
               "in_gemm_weights.attach", params=("self",)),
    TouchPoint("read", "sglang.srt.lora.mem_pool.LoRAMemoryPool", "the pool's TP size and A buffers",
               "in_gemm_weights.extra_rows", attrs=("tp_size", "A_buffer")),
    TouchPoint("read", "sglang.srt.layers.linear.ColumnParallelLinear", "the base GEMM's bias and method (q/k/v)",
               "in_gemm_weights", attrs=("bias", "skip_bias_add", "quant_method")),
    TouchPoint("read", "sglang.srt.layers.linear.RowParallelLinear", "the base GEMM's bias and method (o)",
               "in_gemm_weights", attrs=("bias", "skip_bias_add", "quant_method")),
    TouchPoint("read", "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod",
               "the plain GEMM the extended one replaces (matched by class name)", "in_gemm_weights.PLAIN_LINEAR"),
    TouchPoint("call", f"{LORA_MANAGER}.fetch_new_loras", "bring the adapter to merge into the pool",
               "modes.controller.ModeController.apply", params=("self", "new_loras", "running_loras")),
    TouchPoint("call", f"{LORA_MANAGER}.create_lora_update_result", "a failed load or unload with its reason",
               "guard_hooks, mode_hooks.unload_around", params=("self", "success", "error_message")),
    TouchPoint("read", "sglang.srt.lora.mem_pool.LoRAMemoryPool", "A and B of each adapter by slot",
               "modes.controller.ModeController",
               attrs=("A_buffer", "B_buffer", "uid_to_buffer_id", "get_buffer_id", "max_loras_per_batch")),
    TouchPoint("read", "sglang.srt.lora.lora.LoRAAdapter", "rank and scaling of an adapter",
               "modes.controller.ModeController", attrs=("config", "scaling")),
    TouchPoint("read", "sglang.srt.lora.lora_config.LoRAConfig", "an adapter's rank", "modes.controller", attrs=("r",)),
    TouchPoint("read", "sglang.srt.lora.lora_registry.LoRARef", "an adapter's id, name, folder and pinning",
               "modes.controller, guard_hooks, heads.head_hooks", attrs=("lora_id", "lora_name", "lora_path", "pinned")),
    TouchPoint("read", "sglang.srt.lora.layers.BaseLayerWithLoRA", "the base weights the switcher folds into",
               "modes.controller.ModeController", attrs=("base_layer",)),
    TouchPoint("read", "sglang.srt.lora.layers.QKVParallelLinearWithLoRA", "q/k/v slice offsets",
               "modes.controller._slice_offsets", attrs=("output_offset_cpu",)),
    TouchPoint("read", "sglang.srt.lora.layers.MergedColumnParallelLinearWithLoRA", "gate/up slice offsets",
               "modes.controller._slice_offsets", attrs=("output_offset_cpu",)),
    TouchPoint("read", "sglang.srt.managers.io_struct.LoRAUpdateOutput", "whether a load or unload succeeded",
               "heads.head_hooks", attrs=("success",)),
    TouchPoint("read", "sglang.srt.managers.io_struct.UnloadLoRAAdapterReqInput", "the adapter to unload",
               "mode_hooks.refuse_unloading_merged_around", attrs=("lora_name",)),
]

_REQUEST_READS = [
    TouchPoint(
        "read", TOKENIZER_MANAGER, "the adapters SGLang knows (to read their heads), the vocabulary and the "
        "image placeholder", "guard_hooks", attrs=("lora_registry", "lora_ref_cache", "model_config", "mm_processor"),
    ),
    TouchPoint("read", "sglang.srt.lora.lora_registry.LoRARegistry", "SGLang's registry has no lookup by "
               "name that does not take a reference: read its private dict", "guard_hooks._lora_path",
               attrs=("_registry",)),
    TouchPoint("read", "sglang.srt.configs.model_config.ModelConfig", "token ids must be below it",
               "guard_hooks._check_request", attrs=("vocab_size",)),
    TouchPoint("read", "sglang.srt.multimodal.processors.base_processor.BaseMultimodalProcessor",
               "the model's image placeholder", "guard_hooks._check_request", attrs=("mm_tokens",)),
    TouchPoint("read", "sglang.srt.multimodal.processors.base_processor.MultimodalSpecialTokens",
               "one placeholder per image", "guard_hooks._check_request", attrs=("image_token", "image_token_regex")),
    TouchPoint(
        "read", "sglang.srt.managers.io_struct.GenerateReqInput", "a request's prompts, adapters, images and "
        "parameters", "guard_hooks",
        attrs=("text", "input_ids", "sampling_params", "lora_path", "image_data", "is_single", "batch_size",
               "parallel_sample_num"),
    ),
    TouchPoint("read", "sglang.srt.managers.tokenizer_manager.ReqState", "whether a request has a head answer",
               "heads.head_hooks.skip_empty_answers_around", attrs=("customized_info_accumulated",)),
    TouchPoint("read", "sglang.srt.model_executor.forward_batch_info.ForwardBatch", "LogitsProcessor.forward "
               "gets the forward batch: mode, token counts, adapters, sampling info (the key of the head "
               "tasks in the runtime)", "heads.head_hooks, backend.ATMMLoRABackend",
               attrs=("forward_mode", "sampling_info", "lora_ids", "extend_seq_lens_cpu", "batch_size")),
    TouchPoint("read", "sglang.srt.layers.logits_processor.LogitsProcessorOutput", "head answers ride in "
               "customized_info, which reaches the response's meta_info", "heads.head_hooks.logits_forward_around",
               attrs=("customized_info",)),
]

SERVER_POINTS: list[TouchPoint] = (
    _REGISTRATIONS + _ROUTES + CPU_BRIDGE_POINTS + _BRIDGES + _ARG_READS + _SCHEDULER_READS + _LORA_READS + _REQUEST_READS
)

# ------------------------------------------------------------------------ client
CLIENT_POINTS: list[TouchPoint] = [
    TouchPoint("call", "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint", "VLoRAEndpoint subclasses "
               "SGLang's frontend endpoint to name an adapter on every request", "frontend.VLoRAEndpoint",
               params=("base_url",), attrs=("_add_images", "generate")),
    TouchPoint("call", "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint._add_images", "every request "
               "passes through it right before it is sent", "frontend.VLoRAEndpoint._add_images",
               params=("self", "s", "data")),
    TouchPoint("call", "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint.generate", "head answers as the "
               "generated text", "frontend.VLoRAEndpoint.generate", params=("self", "s", "sampling_params")),
]

TOUCH_POINTS: list[Hook | TouchPoint] = [*ARG_HOOKS, *ACTIVE_HOOKS, *SERVER_POINTS, *CLIENT_POINTS]
