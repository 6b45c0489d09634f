"""How fast a process runs on its machine, measured rather than assumed.

``allocators`` is the memory allocator environment a stage process starts with;
``precision_probe`` and ``inference_probe`` decide ``runtime.precision: auto`` by timing the
candidates (bf16 only when native and faster); ``cost`` times several models in interleaved
rounds in one process (latency ratios with intervals, FLOPs, parameters). The per-machine
measurement cache they share is :mod:`hydra_ops.measurements`. Imports point one way: this
package builds on ``models/`` and ``compile/``, and no library module imports it.
"""
