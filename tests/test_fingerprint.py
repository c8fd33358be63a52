"""Device fingerprint: stable, and different whenever a measured config could differ."""

import dataclasses

import jax
import jaxlib
import pytest

import ejkernel
import ejkernel.version
from ejkernel.ops import device_fingerprint
from ejkernel.ops.fingerprint import describe_device

pytestmark = pytest.mark.lowest


@dataclasses.dataclass
class FakeClient:
    platform_version: str = "cuda 13.0"


@dataclasses.dataclass
class FakeDevice:
    """Just the attributes the fingerprint reads from a `jax.Device`."""

    platform: str = "gpu"
    device_kind: str = "NVIDIA H100 80GB HBM3"
    bytes_limit: int | None = 80 * 2**30
    client: FakeClient = dataclasses.field(default_factory=FakeClient)

    def memory_stats(self):
        if self.bytes_limit is None:
            return None
        return {"bytes_limit": self.bytes_limit, "bytes_in_use": 12345}


def test_stable_across_calls():
    assert device_fingerprint(FakeDevice()) == device_fingerprint(FakeDevice())
    assert device_fingerprint() == device_fingerprint()
    assert device_fingerprint() == device_fingerprint(jax.devices()[0])


def test_default_is_the_first_device():
    fp = device_fingerprint()
    assert isinstance(fp, str) and fp
    assert fp.startswith(jax.devices()[0].device_kind.replace(" ", "_"))


def test_readable_device_kind_leads():
    fp = device_fingerprint(FakeDevice())
    assert fp.startswith("NVIDIA_H100_80GB_HBM3-")
    assert all(c.isalnum() or c in "_-" for c in fp)


def test_changes_with_device_kind():
    h100 = device_fingerprint(FakeDevice(device_kind="NVIDIA H100 80GB HBM3"))
    h200 = device_fingerprint(FakeDevice(device_kind="NVIDIA H200"))
    assert h100 != h200


def test_changes_with_device_kind_even_when_readable_part_collides():
    # "A-B" and "A B" both read "A_B": the hash still tells them apart.
    a = device_fingerprint(FakeDevice(device_kind="GPU-X"))
    b = device_fingerprint(FakeDevice(device_kind="GPU X"))
    assert a.split("-")[0] == b.split("-")[0] == "GPU_X"
    assert a != b


def test_changes_with_memory_size():
    a = device_fingerprint(FakeDevice(bytes_limit=80 * 2**30))
    b = device_fingerprint(FakeDevice(bytes_limit=94 * 2**30))
    assert a != b


def test_in_use_memory_does_not_change_it():
    class Busy(FakeDevice):
        def memory_stats(self):
            return {"bytes_limit": self.bytes_limit, "bytes_in_use": 999_999}

    assert device_fingerprint(Busy()) == device_fingerprint(FakeDevice())


def test_changes_with_platform_and_runtime_version():
    base = device_fingerprint(FakeDevice())
    assert device_fingerprint(FakeDevice(platform="rocm")) != base
    assert device_fingerprint(FakeDevice(client=FakeClient("cuda 12.8"))) != base


def test_device_without_memory_stats_or_client():
    class Bare:
        platform = "cpu"
        device_kind = "cpu"

    fp = device_fingerprint(Bare())
    assert fp.startswith("cpu-")
    assert device_fingerprint(FakeDevice(bytes_limit=None)) != device_fingerprint(FakeDevice())


def test_includes_ejkernel_version(monkeypatch):
    before = device_fingerprint(FakeDevice())
    assert describe_device(FakeDevice())["ejkernel"] == ejkernel.__version__
    monkeypatch.setattr(ejkernel.version, "__version__", ejkernel.__version__ + ".post1")
    after = device_fingerprint(FakeDevice())
    assert after != before
    assert describe_device(FakeDevice())["ejkernel"].endswith(".post1")
    monkeypatch.undo()
    assert device_fingerprint(FakeDevice()) == before


@pytest.mark.parametrize("module", [jax, jaxlib], ids=["jax", "jaxlib"])
def test_includes_jax_versions(monkeypatch, module):
    before = device_fingerprint(FakeDevice())
    monkeypatch.setattr(module, "__version__", module.__version__ + "+other")
    assert device_fingerprint(FakeDevice()) != before


def test_describe_device_fields():
    fields = describe_device(FakeDevice())
    assert fields == {
        "platform": "gpu",
        "device_kind": "NVIDIA H100 80GB HBM3",
        "memory_bytes": str(80 * 2**30),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "runtime": "cuda 13.0",
        "ejkernel": ejkernel.__version__,
    }
