"""The event log, the one truth of a run: its vocabulary, the run records, and the folds every view reads (VM lifecycles, the bill, run progress and summaries)."""
