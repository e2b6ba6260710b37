"""The supervisor's version, as ``pyproject.toml`` gives it (a test keeps the two equal): shown by
``cuzk-supervisor --version`` and in ``/metrics`` (``cuzk_supervisor_build_info``). A constant, not
``importlib.metadata``, which would load a dozen modules into every run for one string."""

VERSION = "0.1.0"
