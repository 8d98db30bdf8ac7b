"""The `hf` data source: a `datasets` dataset saved on disk, the hub offline, rows without a language."""

import pytest
from conftest import cli, one_line_error, write_config

from attn_mt.config import load_config
from attn_mt.data.sources import DataError, read_pairs


def data_cfg(*overrides):
    return load_config(None, list(overrides)).data


def test_hf_dataset_from_local_dir(tmp_path):
    import datasets  # here, not at the top: 1 s of every pytest worker's collection

    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"translation": [{"de": "ein Hund", "en": "a dog"},
                                                             {"de": "Haus", "en": "house"}]}),
        "validation": datasets.Dataset.from_dict({"translation": [{"de": "Katze", "en": "cat"}]}),
    })
    dd.save_to_disk(str(tmp_path / "hf"))
    cfg = data_cfg("data.source=hf", f"data.dir={tmp_path / 'hf'}")
    assert read_pairs(cfg, "train")[1] == ["a dog", "house"]
    assert read_pairs(cfg, "validation")[0] == ["Katze"]
    with pytest.raises(DataError, match="no split 'test'"):
        read_pairs(cfg, "test")


def test_hf_hub_offline_is_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as e:
        read_pairs(data_cfg("data.source=hf", "data.name=attn-mt/does-not-exist"), "train")
    assert "attn-mt/does-not-exist" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("rows,text", [
    ({"translation": [{"en": "a b", "fr": "x"}]}, "'de' is missing"),
    ({"en": ["a b"], "de": [None]}, "'de' is NoneType"),
])
def test_hf_rows_without_a_language_are_one_line_errors(rows, text, tmp_path):
    import datasets

    for split in ("train", "valid", "test"):
        datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds" / split))
    datasets.DatasetDict({s: datasets.load_from_disk(str(tmp_path / "ds" / s)) for s in ("train", "valid", "test")}
                         ).save_to_disk(str(tmp_path / "hf"))
    config = write_config(tmp_path / "c.yaml", "data.source=hf", f"data.dir={tmp_path / 'hf'}")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 1, "row 0", text)
