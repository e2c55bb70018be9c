"""Starting runs: one process group under a limit (``harness``; watched, killed and judged by
``process_group``; what a SIGKILLed owner left, swept by ``leftovers``), the executors
(``preloaded``, ``nodes``, ``slurm_jobs`` with the local ``slurm_cluster``, ``sandbox``), and
the ``launcher``, the only way up from here to start anything."""
