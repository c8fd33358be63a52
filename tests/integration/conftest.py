"""EasyDeL 0.3.0 on this package (`make integration`, in its own venv): the test process is set up by
`easydel_shims.apply()` (the two allowed workarounds). Outside that venv (no EasyDeL) nothing here is
collected."""

import importlib.util

if importlib.util.find_spec("easydel") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import easydel_shims

    easydel_shims.apply()
