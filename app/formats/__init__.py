"""The formats ParaPlan reads and writes: model/cluster/config input (``inputs.py``, ``hf_config.py``,
``bounds.py``, ``errors.py``), evaluation results (``results.py``, ``describe.py``), launch arguments
(``launch.py``), the HTML job report (``report.py``) and published-run validation (``validation.py``).
It imports nothing of ``app.cli`` or ``app.service``."""
