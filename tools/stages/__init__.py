"""What the sessions do, in terms of runs: one matrix cell (``cells``), the bisect's engine
(``bisect``) with its options, tiers and report, git ranges (``gitrange``), the #20706 stress
orchestration (``stress``), the matrix as a SLURM job array (``slurm_matrix``). The programs
that drive them (``bisect_cli``, ``minimize``, ``triage``, ...) are one floor up, in ``tools/``."""
