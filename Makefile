# sglang-vlora: install / serve / test / lint / bench / tune
# On a machine without a GPU, `install` puts SGLang in with its pure-Python dependencies only
# (requirements/sglang-cpu.txt); with a GPU it installs the package with SGLang's full dependency set.

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip install -q
MODEL   ?= .cache/tiny/model
ADAPTERS ?= a8=.cache/tiny/adapters/a8 b16=.cache/tiny/adapters/b16
PORT    ?= 30000
SERVE_ARGS ?=
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: install serve test lint bench tune test-gpu test-gpu-server tiny soak

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/sglang-cpu.txt requirements/dev.txt
	python3 -m venv $(VENV)
ifeq ($(HAS_GPU),1)
	$(PIP) -e ".[dev]" -r requirements/dev.txt
else
	$(PIP) torch==2.14.1 torchvision==0.29.1
	$(PIP) --no-deps sglang==0.5.23
	$(PIP) -r requirements/sglang-cpu.txt -r requirements/dev.txt
	$(PIP) --no-deps -e .
endif
	touch $@

tiny: install
	$(PY) -m sglang_vlora.tiny_model --out .cache/tiny

serve: install $(if $(filter .cache/tiny/model,$(MODEL)),tiny)
	$(PY) -m sglang.launch_server --plugin vlora --model-path $(MODEL) \
		--lora-paths $(ADAPTERS) --port $(PORT) $(SERVE_ARGS)

test: install
	TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider tests

lint: install
	$(VENV)/bin/ruff check .

# Benchmarks: each prints a table and writes JSON + PNG under bench/results/. The kernel and
# mode-switch benchmarks need a GPU (they say so and exit without one). The end-to-end serving
# benchmark runs a short call here (on a GPU: 7B shape, 3 systems, every client; without one: the
# tiny CPU model) into .cache/bench/short/; the full one is a series of GPU calls (docs/bench.md).
bench: install
	$(PY) bench/kernels.py --check
	$(PY) bench/switch.py
	$(PY) bench/mode_cost.py
	$(PY) bench/graph_step.py
	$(PY) bench/run_e2e.py run --call $(if $(HAS_GPU),short,cpu-smoke) --out .cache/bench/short --tag e2e_short
	$(PY) bench/run_e2e.py report .cache/bench/short/e2e_short.json --out .cache/bench/short/report

# Offline tiling search on this GPU; writes sglang_vlora/atmm/tables/<device>.json.
tune: install
	$(PY) -m sglang_vlora.atmm.tune --model llava-1.5-7b qwen2-vl-7b --ranks 8 16 32 64 128

# Kernel checks on a GPU (CI runs the same kernels in Triton's interpreter).
test-gpu: install
	TRITON_INTERPRET=0 $(PY) -m pytest -q tests/kernels/test_cuda.py tests/kernels/test_cuda_sources.py tests/gpu

# The reliability corpus (bad input, wrong-typed request fields) and the task-head server tests
# against a GPU server with CUDA graphs: the same requests and expected answers as on CPU. GPU_TEST_SERVER_FLAGS adds server
# flags (an install without FlashInfer needs --attention-backend triton --sampling-backend pytorch).
GPU_TEST_SERVER_FLAGS ?= --max-total-tokens 16384
GPU_SERVER_TESTS = tests/reliability/test_bad_input.py tests/reliability/test_field_types.py \
	tests/server/test_heads.py tests/reliability/test_profile_requests.py
test-gpu-server: install
	VLORA_TEST_SERVER_FLAGS="$(GPU_TEST_SERVER_FLAGS)" TRITON_INTERPRET=0 $(PY) -m pytest -q $(GPU_SERVER_TESTS)

# The reliability tests' mixed load (every adapter, text and images, mode switches, hot
# load/unload) for SOAK_S seconds instead of two rounds, then the fault and slot tests; bounded.
SOAK_S ?= 300
soak: install
	VLORA_SOAK_S=$(SOAK_S) TRITON_INTERPRET=1 timeout $$(( $(SOAK_S) + 900 )) $(PY) -m pytest -q -rP -p no:cacheprovider \
		tests/reliability/test_load.py tests/reliability/test_faults.py
