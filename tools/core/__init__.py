"""The bottom floor: the verdict contract and the programs' errors (``contract``), result files
written atomically (``results``), the distribution's packages a session installs (``packages``)."""
