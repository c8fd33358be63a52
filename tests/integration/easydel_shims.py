"""The two things worked around to run EasyDeL 0.3.0 on this package, in the importing process only
(`apply()`), and nothing else:
- EasyDeL asserts `ejkernel.__version__ == "0.0.78"` at import: the attribute is set to that (the
  package's real version stays its own);
- transformers 5.5 without torch hands out placeholders for its torch-only `modeling_*` modules, which
  raise ImportError on any attribute; EasyDeL reads attributes of six of them with `getattr(module, name,
  None)` at import. Such a placeholder of a model's own `modeling_<model>` module (not `auto`'s, whose
  placeholder serves transformers' own imports) is wrapped so that those reads give AttributeError.

Also EasyDeL's own switch `EASYDEL_AUTO=0`, which keeps it from appending its GPU XLA flags at import:
JAX 0.11's XLA aborts on one it no longer knows (`--xla_gpu_enable_shared_constants`).
"""

import importlib.util
import os
import types


def apply() -> None:
    """Both workarounds and the switch; call before `import easydel`."""
    os.environ.setdefault("EASYDEL_AUTO", "0")
    import ejkernel

    ejkernel.__version__ = "0.0.78"
    if importlib.util.find_spec("torch") is None:
        _wrap_torch_only_modules()


def _wrap_torch_only_modules() -> None:
    from transformers.utils import import_utils

    class TorchOnlyModule(types.ModuleType):
        """A torch-only transformers module without torch: attribute reads raise AttributeError."""

        def __init__(self, name: str, placeholder) -> None:
            super().__init__(name)
            self._placeholder = placeholder

        def __getattr__(self, attr: str):
            try:
                return getattr(self._placeholder, attr)
            except ImportError as err:
                raise AttributeError(attr) from err

    lazy_getattr = import_utils._LazyModule.__getattr__

    def getattr_(module, name: str):
        value = lazy_getattr(module, name)
        model = module.__name__.rsplit(".", 1)[-1]
        if name == f"modeling_{model}" and model != "auto" and isinstance(value, import_utils.DummyObject):
            value = TorchOnlyModule(f"{module.__name__}.{name}", value)
            setattr(module, name, value)
        return value

    import_utils._LazyModule.__getattr__ = getattr_
