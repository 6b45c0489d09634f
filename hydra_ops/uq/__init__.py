"""Uncertainty quantification on member predictions: tensor maths, no model code.

``checks`` validates labels and scores at the boundary; ``uncertainty`` splits member
probabilities into total / expected entropy, mutual information and disagreement; ``ood_criteria``
scores how out-of-distribution an input looks (higher = more OOD); ``calibration`` fits the
temperature and is the one home of the ensemble prediction (``ensemble_log_probs``,
``ensemble_probs``); ``ood_thresholds`` turns scores into verdicts; ``diversity`` measures how
members differ pairwise. Imports point one way (``checks`` first, ``uncertainty`` before
``ood_criteria``); :mod:`hydra_ops.metrics` judges what this package computes.
"""
