"""Configs: validated, frozen, hashable, JSON round-trippable."""

import dataclasses
import json

import pytest

from ejkernel.modules import MeanPoolingConfig
from ejkernel.ops import BwdParams, ConfigBase, FwdParams, KernelConfig

pytestmark = pytest.mark.lowest

POW2_FIELDS = ("block_q", "block_k", "block_d", "num_warps")


@pytest.mark.parametrize("cls", [FwdParams, BwdParams])
@pytest.mark.parametrize("field", POW2_FIELDS)
@pytest.mark.parametrize("value", [3, 48, 0, -64, True, False, 64.0, "64"])
def test_params_reject_bad_power_of_two_fields(cls, field, value):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field}"):
        cls(**{field: value})


@pytest.mark.parametrize("cls", [FwdParams, BwdParams])
@pytest.mark.parametrize("field", POW2_FIELDS)
@pytest.mark.parametrize("value", [1, 2, 16, 128, 4096])
def test_params_accept_powers_of_two(cls, field, value):
    assert getattr(cls(**{field: value}), field) == value


@pytest.mark.parametrize("cls", [FwdParams, BwdParams])
@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_params_reject_bad_num_stages(cls, value):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.num_stages"):
        cls(num_stages=value)


def test_num_stages_need_not_be_power_of_two():
    assert FwdParams(num_stages=3).num_stages == 3
    assert BwdParams(num_stages=5).num_stages == 5


def test_params_default_to_none():
    params = FwdParams()
    assert all(getattr(params, f.name) is None for f in dataclasses.fields(params))


def test_error_names_the_offending_field_only():
    with pytest.raises(ValueError) as err:
        FwdParams(block_q=64, block_k=96, block_d=32)
    assert "block_k" in str(err.value)
    assert "96" in str(err.value)


def test_params_are_frozen():
    params = FwdParams(block_q=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.block_q = 128
    cfg = MeanPoolingConfig(fwd_params=params)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.platform = "xla"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.fwd_params = None


def test_params_hashable_and_equal_by_value():
    a, b = FwdParams(block_q=64, num_warps=4), FwdParams(block_q=64, num_warps=4)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, FwdParams(block_q=128)}) == 2
    # Forward and backward tilings with equal fields are still different things.
    assert FwdParams(block_q=64) != BwdParams(block_q=64)


def test_kernel_configs_hashable_including_nested_params():
    a = MeanPoolingConfig(platform="xla", fwd_params=FwdParams(block_k=32), bwd_params=BwdParams(block_k=16))
    b = MeanPoolingConfig(platform="xla", fwd_params=FwdParams(block_k=32), bwd_params=BwdParams(block_k=16))
    c = dataclasses.replace(a, fwd_params=FwdParams(block_k=64))
    d = a.with_platform("triton")
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d
    table = {a: "a", c: "c", d: "d"}
    assert table[b] == "a" and len(table) == 3


@pytest.mark.parametrize(
    "cfg",
    [
        MeanPoolingConfig(),
        MeanPoolingConfig(platform="xla"),
        MeanPoolingConfig(platform="triton", fwd_params=FwdParams(block_k=32, block_d=512, num_warps=4)),
        MeanPoolingConfig(
            platform="pallas",
            fwd_params=FwdParams(block_q=128, block_k=64, num_stages=3),
            bwd_params=BwdParams(block_q=64, block_k=32, block_d=128, num_warps=8, num_stages=2),
        ),
    ],
)
def test_json_round_trip(cfg):
    text = cfg.to_json()
    json.loads(text)  # plain JSON
    back = ConfigBase.from_json(text)
    assert back == cfg
    assert type(back) is MeanPoolingConfig
    assert hash(back) == hash(cfg)
    if cfg.fwd_params is not None:
        assert type(back.fwd_params) is FwdParams
    if cfg.bwd_params is not None:
        assert type(back.bwd_params) is BwdParams
    # A second round trip is stable text.
    assert back.to_json() == text


def test_json_names_type_and_nests_params():
    """Flat, as upstream writes it: the fields, unset ones left out, tiling under upstream's names; and the
    class name, so that a config read back is the one written."""
    cfg = MeanPoolingConfig(platform="xla", fwd_params=FwdParams(block_k=16, block_d=32))
    data = json.loads(cfg.to_json())
    assert data == {"type": "MeanPoolingConfig", "platform": "xla", "backend": "any",
                    "fwd_params": {"kv_blocksize": 16, "block_d": 32}}  # fmt: skip
    assert MeanPoolingConfig.from_json(json.dumps({"platform": "xla"})) == MeanPoolingConfig(platform="xla")
    older = {"type": "MeanPoolingConfig", "fields": {"platform": "xla", "fwd_params": {"block_k": 16, "block_d": 32}}}
    assert ConfigBase.from_json(json.dumps(older)) == cfg  # caches written before
    with pytest.raises(ValueError, match="not a serialised MeanPoolingConfig"):
        MeanPoolingConfig.from_json(FwdParams(block_q=8).to_json())


def test_params_round_trip_alone():
    for params in (FwdParams(block_q=32, num_stages=3), BwdParams(block_k=16)):
        back = ConfigBase.from_json(params.to_json())
        assert back == params and type(back) is type(params)


def test_dict_round_trip():
    cfg = MeanPoolingConfig(platform="xla", fwd_params=FwdParams(block_k=8))
    assert MeanPoolingConfig.from_dict(cfg.to_dict()) == cfg
    # Missing fields take their defaults.
    assert MeanPoolingConfig.from_dict({"platform": "xla"}) == MeanPoolingConfig(platform="xla")


def test_unknown_type_is_value_error():
    with pytest.raises(ValueError, match="NoSuchConfig"):
        ConfigBase.from_json(json.dumps({"type": "NoSuchConfig", "fields": {}}))
    with pytest.raises(ValueError, match="unknown config type"):
        ConfigBase.from_json(json.dumps({"fields": {}}))


def test_unknown_fields_are_value_error():
    text = json.dumps({"type": "MeanPoolingConfig", "fields": {"platform": "xla", "block_size": 64}})
    with pytest.raises(ValueError, match="block_size"):
        ConfigBase.from_json(text)
    with pytest.raises(ValueError, match="tile"):
        MeanPoolingConfig.from_dict({"fwd_params": {"block_q": 64, "tile": 3}})


def test_json_values_are_validated():
    text = json.dumps({"type": "MeanPoolingConfig", "fields": {"fwd_params": {"block_k": 48}}})
    with pytest.raises(ValueError, match="block_k"):
        ConfigBase.from_json(text)
    text = json.dumps({"type": "MeanPoolingConfig", "fields": {"platform": "opencl"}})
    with pytest.raises(ValueError, match="platform"):
        ConfigBase.from_json(text)


def test_invalid_json_text_is_value_error():
    with pytest.raises(ValueError):
        ConfigBase.from_json('{"type": "MeanPoolingConfig", "fields": {')


@pytest.mark.parametrize("platform", ["auto", "xla", "triton", "pallas", "cuda"])
def test_platform_accepts_known(platform):
    assert MeanPoolingConfig(platform=platform).platform == platform
    assert KernelConfig(platform=platform).platform == platform


# ids spelled out: a bare "gpu" id would be taken for the `gpu` marker by conftest and skipped.
@pytest.mark.parametrize("platform", ["XLA", "gpu", "cpu", "", None, "mosaic"], ids=lambda v: f"platform={v!r}")
def test_platform_rejects_unknown(platform):
    with pytest.raises(ValueError, match="platform"):
        MeanPoolingConfig(platform=platform)


def test_with_platform_validates_and_copies():
    cfg = MeanPoolingConfig(fwd_params=FwdParams(block_k=16))
    moved = cfg.with_platform("xla")
    assert moved.platform == "xla" and moved.fwd_params == cfg.fwd_params
    assert cfg.platform == "auto"
    with pytest.raises(ValueError, match="platform"):
        cfg.with_platform("tpu")


def test_allowed_platforms_is_per_config_type():
    @dataclasses.dataclass(frozen=True)
    class ToyXlaOnlyConfig(KernelConfig):
        allowed_platforms = ("auto", "xla")

    assert ToyXlaOnlyConfig(platform="xla").platform == "xla"
    with pytest.raises(ValueError, match=r"ToyXlaOnlyConfig\.platform"):
        ToyXlaOnlyConfig(platform="triton")


def test_params_fields_must_hold_params():
    with pytest.raises(ValueError, match="fwd_params"):
        MeanPoolingConfig(fwd_params={"block_k": 16})
    with pytest.raises(ValueError, match="bwd_params"):
        MeanPoolingConfig(bwd_params=FwdParams(block_k=16))


@dataclasses.dataclass(frozen=True)
class ToyTupleFieldConfig(KernelConfig):
    """A config with a sequence-valued field, as some ops need (e.g. chunk sizes to try)."""

    chunks: tuple[int, ...] = (16, 32)


def test_json_round_trip_keeps_tuple_fields_hashable():
    cfg = ToyTupleFieldConfig(platform="xla", chunks=(8, 64))
    back = ConfigBase.from_json(cfg.to_json())
    assert back == cfg
    assert hash(back) == hash(cfg)
