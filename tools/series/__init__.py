"""The patch series and upstream's gates: the patches (``patches``), environments with them
applied (``patched``), the gates each passes (``series_gates``, ``gates``, ``upstream_tests``,
``torch_host``, ``open_work``, ``claims``)."""
