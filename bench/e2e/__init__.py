"""End-to-end serving benchmark: one SGLang server per system, the same model, adapters and
workloads for all, measured one system at a time.

* :mod:`bench.e2e.plan`: systems, points (workloads), calls (what one GPU call runs) and the
  order of the measurements; pure Python.
* :mod:`bench.e2e.servers`: starting the servers of a call side by side on one GPU,
  warming them up, reading ``/vlora/status``.
* :mod:`bench.e2e.measure`: one measurement with either client (:mod:`bench.client` or
  SGLang's own ``sglang.benchmark.serving``), in one metrics layout.
* :mod:`bench.e2e.runner`: one call from start to results JSON.
* :mod:`bench.e2e.report`: results files of any number of calls merged: repeats, spread,
  LoRA cost over the no-LoRA floor, markdown, plots, the README's headline table.

Git revision, versions and device come from :mod:`bench.provenance`, as for every benchmark.

The command line is ``bench/run_e2e.py``; docs/bench.md explains the method.
"""
