import json

import pytest
from conftest import cli, one_line_error, write_config

from attn_mt.config import load_config
from attn_mt.data.lines import DataError, line_chunks
from attn_mt.data.sources import read_pairs


def write_files(d, split, src, tgt):
    (d / f"{split}.de").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (d / f"{split}.en").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")


def data_cfg(*overrides):
    return load_config(None, list(overrides)).data


def test_files_strip_and_drop_empty(tmp_path):
    write_files(tmp_path, "train", ["  ein Hund ", "", "zwei"], ["a dog", "x", "two  "])
    src, tgt = read_pairs(data_cfg("data.source=files", f"data.dir={tmp_path}"), "train")
    assert src == ["ein Hund", "zwei"] and tgt == ["a dog", "two"]


def test_mismatched_counts_name_both_files(tmp_path):
    write_files(tmp_path, "train", ["a", "b", "c"], ["a", "b"])
    with pytest.raises(DataError, match=r"train\.de has 3 lines.*train\.en has 2"):
        read_pairs(data_cfg("data.source=files", f"data.dir={tmp_path}"), "train")


def test_missing_file_and_bad_utf8(tmp_path):
    cfg = data_cfg("data.source=files", f"data.dir={tmp_path}")
    with pytest.raises(DataError, match=r"train\.de: data file not found"):
        read_pairs(cfg, "train")
    (tmp_path / "train.de").write_bytes(b"gut\nschlecht \xff\n")
    (tmp_path / "train.en").write_text("good\nbad\n")
    with pytest.raises(DataError, match=r"train\.de:2: invalid UTF-8"):
        read_pairs(cfg, "train")


def test_jsonl(tmp_path):
    rows = [{"translation": {"de": "ein Hund", "en": "a dog"}},
            {"translation": {"de": "Haus", "en": "house"}}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    src, tgt = read_pairs(data_cfg("data.source=jsonl", f"data.dir={tmp_path}"), "train")
    assert src == ["ein Hund", "Haus"] and tgt == ["a dog", "house"]
    (tmp_path / "valid.jsonl").write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"valid\.jsonl:2"):
        read_pairs(data_cfg("data.source=jsonl", f"data.dir={tmp_path}"), "valid")


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


def test_toy_source():
    src, tgt = read_pairs(data_cfg("data.source=toy", "data.toy_size=50", "data.src_lang=en",
                                   "data.tgt_lang=de"),
                          "valid")
    assert len(src) == len(tgt) == 100


@pytest.mark.parametrize("line,text", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                       ('{"translation": {"en": 1' + "0" * 5000 + ', "de": "x"}}',
                                        ":1: expected")])
def test_hostile_jsonl_lines_are_one_line_errors(line, text, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        (data / f"{split}.jsonl").write_text(line + "\n")
    config = write_config(tmp_path / "c.yaml", "data.source=jsonl", f"data.dir={data}")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 1, ".jsonl:1", text)


@pytest.mark.parametrize("rows,text", [
    ({"translation": [{"en": "a b", "fr": "x"}]}, "'de' is missing"),
    ({"en": ["a b"], "de": [None]}, "'de' is NoneType"),
])
def test_hf_rows_without_a_language_are_one_line_errors(rows, text, tmp_path):
    import datasets

    for split in ("train", "valid", "test"):
        datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds" / split))
    datasets.DatasetDict({s: datasets.load_from_disk(str(tmp_path / "ds" / s))
                          for s in ("train", "valid", "test")}
                         ).save_to_disk(str(tmp_path / "hf"))
    config = write_config(tmp_path / "c.yaml", "data.source=hf", f"data.dir={tmp_path / 'hf'}")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 1, "row 0", text)


def test_line_chunks_count_lines_across_chunks(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"a\n b \n\nc\r\nd\n\xc3\n")
    with pytest.raises(DataError, match=r"x\.txt:6: invalid UTF-8"):
        list(line_chunks(path, size=2))
    path.write_bytes(b"a\n b \n\nc\r\nd")  # no final newline
    assert list(line_chunks(path, size=2)) == [["a", "b"], ["", "c"], ["d"]]
