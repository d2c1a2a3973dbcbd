"""The paper's experiments and the policy's evaluation, run with real processes on the local backend."""
