"""configs/*.yaml and framefuse.config: loading, validation, overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from framefuse import config as ffconfig
from framefuse.config import ConfigError, load_config, parse_override
from framefuse.errors import FrameFuseError

REPO = Path(__file__).resolve().parent.parent
ZOO = ["min_gru", "min_lstm", "mamba", "gated_ssm", "liquid", "lstm", "gru", "delta_net", "xlstm", "attention", "jamba"]


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("arch", ZOO)
def test_every_zoo_arch_has_a_config_with_the_standard_settings(arch):
    path = REPO / "configs" / f"{arch}.yaml"
    assert path.is_file(), f"missing {path}"
    cfg = load_config(path)
    assert cfg["arch"] == arch
    assert cfg["model"]["embed"] == 256 and cfg["model"]["layers"] == 2
    assert (cfg["batch"], cfg["seq"], cfg["in_features"], cfg["out_features"]) == (1, 32, 64, 32)
    assert cfg["precision"] == "fp32"
    assert cfg["tolerance"] == {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2, "int8": 1e-1}
    assert isinstance(cfg["seed"], int)
    assert cfg["opset"] == 17


def test_config_model_sections_match_the_zoo_defaults():
    models = pytest.importorskip("framefuse.models")
    assert sorted(models.ARCHITECTURES) == sorted(ZOO)
    for arch in models.ARCHITECTURES:
        raw = ffconfig._read_yaml(REPO / "configs" / f"{arch}.yaml")
        zoo = {k: v for k, v in models.default_config(arch).items() if k not in ("in_features", "out_features")}
        # the file spells out every key of the architecture, with the zoo's default values
        assert raw["model"] == zoo, arch


def test_arch_config_is_found_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = ffconfig.find_arch_config("mamba")
    assert found is not None and found.resolve() == (REPO / "configs" / "mamba.yaml").resolve()
    assert load_config(arch="mamba")["model"]["d_state"] == 16
    assert "mamba" in ffconfig.available_configs()


def test_defaults_without_a_file():
    cfg = load_config()
    assert cfg["arch"] is None
    assert cfg["model"] == {"embed": 256, "layers": 2}
    assert ffconfig.tolerance(cfg) == 1e-4
    assert ffconfig.tolerance(cfg, "bf16") == 3e-2
    assert ffconfig.model_config(cfg) == {"embed": 256, "layers": 2, "in_features": 64, "out_features": 32}


def test_unknown_top_level_key_names_file_and_key(tmp_path):
    path = write(tmp_path, "arch: min_gru\nbatchsize: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message and "'batchsize'" in message
    assert "did you mean 'batch'" in message
    assert isinstance(err.value, FrameFuseError)


def test_unknown_model_key_names_file_and_key(tmp_path):
    path = write(tmp_path, "arch: mamba\nmodel:\n  d_stat: 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "'model.d_stat'" in str(err.value)
    assert "d_state" in str(err.value)


def test_unknown_tolerance_key(tmp_path):
    path = write(tmp_path, "tolerance:\n  fp8: 0.5\n")
    with pytest.raises(ConfigError, match=r"tolerance\.fp8"):
        load_config(path)


@pytest.mark.parametrize(
    "text, key",
    [
        ("batch: 0\n", "batch"),
        ("seq: -3\n", "seq"),
        ("in_features: 2.5\n", "in_features"),
        ("precision: fp8\n", "precision"),
        ("opset: 16\n", "opset"),
        ("seed: -1\n", "seed"),
        ("tolerance:\n  fp32: 0\n", "tolerance.fp32"),
        ("model: 5\n", "model"),
        ("model:\n  in_features: 8\n", "model.in_features"),
    ],
)
def test_invalid_values_name_the_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"'{key}'" in str(err.value) and str(path) in str(err.value)


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "arch: min_gru\nmodel: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "line" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_config_for_another_arch_is_an_error(tmp_path):
    path = write(tmp_path, "arch: lstm\n")
    with pytest.raises(ConfigError, match="arch 'lstm' but arch 'gru'"):
        load_config(path, arch="gru")


def test_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "arch: mamba\nmodel:\n  embed: 64\n  d_state: 8\nseq: 16\n")
    cfg = load_config(
        path,
        overrides={
            "embed": 128,
            "layers": 3,
            "seq": 8,
            "batch": 2,
            "model.d_state": 4,
            "tolerance.fp32": 1e-5,
            "opset": 18,
        },
    )
    assert cfg["model"]["embed"] == 128 and cfg["model"]["layers"] == 3 and cfg["model"]["d_state"] == 4
    assert cfg["model"]["d_conv"] == 4  # untouched keys keep the zoo default
    assert (cfg["seq"], cfg["batch"], cfg["opset"]) == (8, 2, 18)
    assert cfg["tolerance"]["fp32"] == 1e-5 and cfg["tolerance"]["fp16"] == 1e-2
    # the arch's own key works without the model. prefix too
    assert load_config(arch="mamba", overrides={"d_state": 32})["model"]["d_state"] == 32


def test_none_overrides_are_ignored():
    assert load_config(arch="min_gru", overrides={"embed": None, "seq": None})["seq"] == 32


def test_unknown_override_is_an_error():
    with pytest.raises(ConfigError, match="command line: unknown key 'widht'"):
        load_config(arch="min_gru", overrides={"widht": 3})
    with pytest.raises(ConfigError, match="'model.heads'"):
        load_config(arch="mamba", overrides={"model.heads": 3})
    with pytest.raises(ConfigError, match="'batch' must be a positive integer"):
        load_config(arch="min_gru", overrides={"batch": 0})


def test_parse_override_types():
    assert parse_override("model.heads=8") == ("model.heads", 8)
    assert parse_override("tolerance.fp32=1e-5") == ("tolerance.fp32", 1e-5)
    assert parse_override("model.dt_rank=auto") == ("model.dt_rank", "auto")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("model.heads")
    with pytest.raises(ConfigError, match="no value"):
        parse_override("model.heads=")


def test_to_json_is_canonical():
    a = load_config(arch="min_gru")
    b = dict(reversed(list(a.items())))
    assert ffconfig.to_json(a) == ffconfig.to_json(b)
    assert os.linesep not in ffconfig.to_json(a)
