"""What the ``evaluate`` stage computes beside the metrics of the library: one model's scorecard
(:mod:`.scorecard`), the cost of every model timed in one process (:mod:`.cost`) and member
diversity (:mod:`.member_diversity`)."""
