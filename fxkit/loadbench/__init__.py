"""``fxkit bench load``: the loader (:mod:`fxkit.loader`) measured beside the plain safetensors
baseline, the storage's limit (fio) and its peers, apart from the loader itself.

- :mod:`fxkit.loadbench.bench`: one process per run, methods in interleaved rounds, cold or hot;
- :mod:`fxkit.loadbench.bench_ranks`: ``--ranks N``, N processes loading one checkpoint at once,
  with the bytes the node read from its disk;

It calls the loader only through its public names (``fxkit.loader.__all__``), as the rest of
fxkit does. docs/BENCHMARKS.md has the method and the numbers.
"""
