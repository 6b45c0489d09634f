"""Efficient-ensemble baselines built on one fine-tuned classifier, one module per method.

* :mod:`hydra_ops.baselines.lora_ensemble`: LoRA-Ensemble (Mühlematter et al., 2024), M LoRA
  adapters (``peft``) on the frozen base's attention projections, each with its own classifier.
* :mod:`hydra_ops.baselines.batch_ensemble`: BatchEnsemble (Wen, Tran & Ba, ICLR 2020), M members
  sharing every weight matrix of the base and differing by rank-1 fast weights.

Both take a contract batch (docs/architecture.md) and return member logits ``[B, M, C]``, like a
:class:`hydra_ops.hydra.ensemble.HydraEnsemble`, and work for every family of
:mod:`hydra_ops.adapters`. The helpers they share (member-major batches) are in
:mod:`hydra_ops.baselines.batching`.
"""
