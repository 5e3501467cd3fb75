"""Wire adapters of the task engine: each parses its dialect's requests into engine calls and
renders engine state into its wire shapes, and nothing else."""
