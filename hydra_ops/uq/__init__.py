"""Uncertainty quantification on member predictions: tensor maths, no model code.

``checks`` validates labels and scores at the boundary; ``uncertainty`` splits member
probabilities into total / expected entropy, mutual information and disagreement; ``ood_criteria``
scores how out-of-distribution an input looks (higher = more OOD; one criterion per module, in the
registry ``OOD_CRITERIA``); ``calibration`` fits the temperature and is the one home of the
ensemble prediction (``ensemble_log_probs``, ``ensemble_probs``); ``calibrated`` gives every
``predict`` column from one temperature; ``ood_thresholds`` turns scores into verdicts;
``diversity`` measures how members differ pairwise. Imports point one way: ``checks`` <-
``calibration``; ``uncertainty`` <- ``ood_criteria`` <- ``calibrated`` (which also reads
``calibration``). The package imports nothing else of hydra_ops but :mod:`hydra_ops.registry`;
:mod:`hydra_ops.metrics` judges what it computes.
"""
