"""What to install for a Lightning and a torch release as of its date: release facts from the
index (``index``), environments planned and cached (``envs``), the repro matrix (``matrix``)."""
