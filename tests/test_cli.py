"""The `attn-mt` command end to end: train, translate, evaluate on a tiny config; bad input of every
kind (config, data, checkpoint, run directory) ends in one clear line on stderr, a non-zero status
and no traceback."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import Evil, cli, one_line_error, snapshot, write_config
from sacrebleu.metrics import BLEU, CHRF

from attn_mt.data.toy import make_toy_corpus

# the venv's command (pytest may run as .venv/bin/python without the venv on PATH), else PATH's
_VENV_CMD = Path(sys.executable).parent / "attn-mt"
ATTN_MT = (str(_VENV_CMD) if _VENV_CMD.exists() else shutil.which("attn-mt")) or pytest.skip(
    "attn-mt is not installed", allow_module_level=True)


def run(*args, stdin=None):
    return subprocess.run([ATTN_MT, *args], input=stdin, capture_output=True, text=True,
                          timeout=600)


def test_help_lists_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("train", "translate", "evaluate", "download"):
        assert command in out.stdout
    module = subprocess.run([sys.executable, "-m", "attn_mt", "--help"], capture_output=True,
                            text=True)
    assert module.returncode == 0 and "translate" in module.stdout


@pytest.mark.slow
def test_train_translate_evaluate(tmp_path):
    """The installed command trains; the run's checkpoint translates and evaluates (in this process:
    their own installed-command tests are test_stdin_lines_end_at_newline_only and the interactive
    prompt's)."""
    cfg = write_config(tmp_path / "tiny.yaml")
    out = tmp_path / "run"
    result = run("train", "--config", str(cfg), "--out", str(out), "--set", "train.max_epochs=1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("test BLEU") == 1 and "test BLEU" not in result.stderr  # one summary
    assert ((out / "test.en").read_text().count("\n")
            == (out / "test_hyps.txt").read_text().count("\n"))
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["max_epochs"] == 1 and saved["model"]["d_model"] == 32
    ckpt = out / "checkpoint_best.pt"

    lines = ["the dog sees a cat.", "", "a woman says that the men find a book."]
    result = cli("translate", "--checkpoint", ckpt, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    outputs = result.stdout.split("\n")[:-1]
    assert len(outputs) == 3 and outputs[1] == ""

    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the dog sees a cat.\nthe men like the horse.\n")
    ref.write_text("der Hund sieht eine Katze.\ndie Männer mögen das Pferd.\n")
    hyps = cli("translate", "--checkpoint", ckpt, "--input", src).stdout.splitlines()
    assert len(hyps) == 2
    assert cli("translate", "--checkpoint", ckpt, "the dog sees a cat.").stdout.count("\n") == 1
    result = cli("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    # evaluate scores what translate writes, against the references
    refs = ref.read_text().splitlines()
    assert scores["bleu"] == round(BLEU().corpus_score(hyps, [refs]).score, 2)
    assert scores["chrf"] == round(CHRF().corpus_score(hyps, [refs]).score, 2)
    assert scores["bleu_signature"].startswith("nrefs:1")


def test_config_error_exit_code_and_one_line(tmp_path):
    one_line_error(cli("train", "--config", write_config(tmp_path / "tiny.yaml"), "--set",
                       "model.n_heads=3"), 2,
                   "config error: ", "n_heads=3")


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False])
def test_download_offline_fails_fast_with_each_line_once(tmp_path, quiet):
    # nothing answers there
    proxy = ["https_proxy=http://127.0.0.1:9", "HTTPS_PROXY=http://127.0.0.1:9"]
    env_cmd = ["env", "HF_HUB_OFFLINE=0", "HF_DATASETS_OFFLINE=0", *proxy, ATTN_MT,
               *(["--quiet"] if quiet else []), "download", "multi30k", "--out",
               str(tmp_path / "m30k")]
    result = subprocess.run(env_cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert (lines[-1].startswith("error: cannot download multi30k")
            and len(lines) == (1 if quiet else 3)), lines
    assert len(set(lines)) == len(lines) and not any("Retry" in line for line in lines)
    assert not (tmp_path / "m30k").exists()  # no empty folder left behind


def test_nbest_without_beam_names_the_flags(tiny_run):
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--nbest", "3",
                 "a dog.")
    assert result.exit_code == 2
    assert ("--nbest" in result.output and "--beam 3" in result.output
            and "decode.nbest" not in result.output)
    result = cli("translate", "--checkpoint", tiny_run / "checkpoint_best.pt", "--beam", "0",
                 "a dog.")
    assert (result.exit_code == 2 and "--beam 0" in result.output
            and "decode.beam_size" not in result.output)


def test_global_options_after_the_command(tmp_path):
    missing = tmp_path / "missing.pt"
    result = cli("translate", "--checkpoint", missing, "a dog.", "--quiet", quiet=False)
    assert result.exit_code == 1 and result.stderr == f"error: {missing}: checkpoint not found\n"
    result = cli("translate", "--checkpoint", missing, "a dog.", "--debug", quiet=False)
    # --debug lets the exception through
    assert type(result.exception).__name__ == "CheckpointError"


def test_attention_on_a_folder_says_what_it_needs(tmp_path):
    one_line_error(cli("attention", "--checkpoint", tmp_path, "a dog.", "--out", tmp_path / "figs"),
                   1, "a folder (an export?)")


def test_average_without_snapshots_hints_at_keep_last(tiny_run, tmp_path):
    one_line_error(cli("average", tiny_run / "checkpoint_step*.pt", "--out", tmp_path / "avg.pt"),
                   1, "checkpoint not found", "train.keep_last")


@pytest.mark.parametrize(("command", "offline"), [("compare-rnn", "--quick"),
                                                  ("bench", "configs/toy.yaml")])
def test_missing_multi30k_says_how_to_get_it(command, offline, tmp_path):
    config = (Path(__file__).resolve().parents[1] / "configs"
              / ("compare.yaml" if command == "compare-rnn"
                 else "multi30k.yaml"))
    out = tmp_path / "report"
    args = ["--out", out] if command == "compare-rnn" else []
    one_line_error(
        cli(command, "--config", config, "--set", f"data.dir={tmp_path / 'none'}", *args), 1,
                   "data file not found", "attn-mt download multi30k", "MULTI30K_DIR",
        "--set data.dir=", offline)
    assert not out.exists()


@pytest.mark.parametrize("model", ["transformer", "rnn"])
def test_compare_rnn_refuses_an_out_whose_model_folder_holds_a_run(
        model, tmp_path, tiny_run, monkeypatch):
    """compare-rnn writes OUT/transformer/attention_history.npz and OUT/rnn/...: over a run trained
    into OUT/transformer that run's checkpoint then served another model's history. Refused before
    any work."""
    import attn_mt.measure.compare

    monkeypatch.setattr(attn_mt.measure.compare, "compare_rnn", lambda *a: pytest.fail("compared"))
    (tmp_path / "out").mkdir()
    run = tmp_path / "out" / model
    copy_run(tiny_run, run)
    (run / "attention_history.npz").write_bytes(b"the run's own history")
    before = snapshot(run)
    config = Path(__file__).resolve().parents[1] / "configs" / "compare.yaml"
    one_line_error(cli("compare-rnn", "-c", config, "--out", tmp_path / "out", "--quick"), 2,
                   f"--out {tmp_path / 'out'}: {run} holds a run's files")
    assert snapshot(run) == before


def write_corpus(d: Path) -> list[str]:
    """Toy pairs as {split}.en / {split}.de files in `d`; returns the overrides that read them."""
    d.mkdir()
    for split, pairs in make_toy_corpus(20, 0).items():
        for i, lang in enumerate(("en", "de")):
            (d / f"{split}.{lang}").write_text("".join(pair[i] + "\n" for pair in pairs))
    return ["data.source=files", f"data.dir={d}"]


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("checkpoint_last.pt", "spm.model", "tokenizer.json"):
        shutil.copy(src / name, dst / name)
    return dst / "checkpoint_last.pt"


def _yaml(text: str | bytes, name: str = "bad.yaml"):
    def setup(tmp, run):
        path = tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.format(tmp=tmp).encode())
        return ["train", "-c", path, "--out", tmp / "run"]
    return setup


def _data(edit, *overrides: str):
    def setup(tmp, run):
        sets = write_corpus(tmp / "data")
        edit(tmp / "data")
        return ["train", "-c", write_config(tmp / "c.yaml", *sets, *overrides), "--out",
                tmp / "run"]
    return setup


def _resume(edit, *overrides: str):
    def setup(tmp, run):
        out = tmp / "run"
        if edit is not None:
            edit(copy_run(run, out))
        return ["train", "-c", write_config(tmp / "c.yaml", *overrides), "--out", out, "--resume"]
    return setup


def _with_version(path: Path, version: int) -> None:
    state = torch.load(path, weights_only=True)
    state["format_version"] = version
    torch.save(state, path)


def _unwritable_out(tmp, run):
    (tmp / "file").write_text("a file, not a directory")
    return ["train", "-c", write_config(tmp / "c.yaml"), "--out", tmp / "file" / "run"]


def _evil_checkpoint(tmp, run):
    torch.save({"model": Evil(tmp / "PWNED"), "config": {}, "format_version": 1}, tmp / "evil.pt")
    return ["translate", "--checkpoint", tmp / "evil.pt", "hello"]


CASES = {
    "missing config": (lambda tmp, run: ["train", "-c", tmp / "nope.yaml"], 2,
                       ["nope.yaml: config file not found"]),
    "config is a directory": (lambda tmp, run: ["train", "-c", tmp], 2, ["cannot read config"]),
    "yaml syntax": (_yaml("train:\n  lr: 0.1\n  betas: [0.9, 0.98\n  seed: 2\n"), 2,
                    ["bad.yaml: line 4, column 7: YAML syntax error"]),
    "yaml tab": (_yaml("train:\n\tlr: 0.1\n"), 2,
                 ["bad.yaml: line 2, column 1: YAML syntax error"]),
    "config not utf-8": (_yaml(b"train:\n  device: cpu\n  # caf\xe9\n"), 2,
                         ["bad.yaml: line 3: invalid UTF-8"]),
    "unknown key": (_yaml("train:\n  lrr: 0.1\n"), 2,
                    ["bad.yaml: unknown key 'train.lrr'; allowed in train: lr,"]),
    "unknown section": (_yaml("trian:\n  lr: 0.1\n"), 2, ["unknown key 'trian'"]),
    "wrong type": (_yaml("train:\n  max_epochs: two\n"), 2,
                   ["train.max_epochs='two': expected int, got str"]),
    "section not a mapping": (_yaml("train: 5\n"), 2, ["bad.yaml: train: expected a mapping"]),
    "bad override": (lambda tmp, run: ["train", "-c", write_config(tmp / "c.yaml"), "--set",
                                       "train.lr=-1"],
                     2, ["train.lr=-1.0: must be > 0"]),
    "python tag": (_yaml("train: !!python/object/apply:os.system ['touch {tmp}/PWNED']\n"), 2,
                   ["bad.yaml: line 1, column 8: YAML syntax error",
                    "python/object/apply:os.system"]),
    "missing data file": (_data(lambda d: (d / "valid.de").unlink()), 1,
                          ["valid.de: data file not found"]),
    "line counts differ": (_data(lambda d: (d / "train.de").open("a").write("one more\n")), 1,
                           ["line counts differ", "train.en has 20 lines", "train.de has 21"]),
    "empty corpus": (_data(lambda d: [(d / f"train.{lang}").write_text("")
                                      for lang in ("en", "de")]), 1,
                     ["split 'train'", "has no non-empty pairs"]),
    "blank valid split": (_data(lambda d: [(d / f"valid.{la}").write_text("\n \n\n")
                                           for la in ("en", "de")]),
                          1, ["split 'valid'", "has no non-empty pairs"]),
    "filtering empties the split": (_data(lambda d: None, "data.max_len=1"), 1,
                                    ["split 'train': no pair has at most 1 tokens"]),
    "data not "
    "utf-8": (_data(lambda d: (d / "train.en").write_bytes(b"ok\nok\nbad \xff\n" + b"ok\n" * 17)),
              1, ["train.en:3: invalid UTF-8 (byte 0xff)"]),
    "resume without checkpoint": (_resume(None), 1, ["checkpoint_last.pt: checkpoint not found"]),
    "truncated "
    "checkpoint": (_resume(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])), 1,
                   ["checkpoint_last.pt: not a readable checkpoint (truncated or "
                    "corrupt"]),
    "checkpoint of another version": (_resume(lambda p: _with_version(p, 99)), 1,
                                      ["checkpoint_last.pt: written by checkpoint format 99"]),
    "resume another model": (_resume(lambda p: None, "model.d_model=64"), 1,
                             ["--resume: model.d_model is 64, the checkpoint was trained with 32"]),
    "translate without checkpoint": (lambda tmp, run: ["translate", "--checkpoint", tmp / "nope.pt",
                                                       "hi"], 1,
                                     ["nope.pt: checkpoint not found"]),
    "crafted checkpoint": (_evil_checkpoint, 1,
                           ["evil.pt: refused: holds objects other than tensors"]),
    "unwritable run directory": (_unwritable_out, 1,
                                 ["run: run directory is not writable (Not a directory)"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_clear_line(case, tmp_path, tiny_run):
    setup, status, texts = CASES[case]
    result = cli(*setup(tmp_path, tiny_run))
    assert result.exit_code == status, result.output
    assert isinstance(result.exception, SystemExit)  # ended by the error handler, not an exception
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for text in texts:
        assert text in result.stderr
    assert not (tmp_path / "PWNED").exists()


def test_debug_shows_the_exception(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lrr: 1\n")
    result = cli("--debug", "train", "-c", path)
    assert type(result.exception).__name__ == "ConfigError" and "train.lrr" in str(result.exception)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["yaml syntax", "data not utf-8", "truncated checkpoint"])
def test_installed_command_prints_no_traceback(case, tmp_path, tiny_run):
    setup, status, texts = CASES[case]
    out = subprocess.run([ATTN_MT, "--quiet", *map(str, setup(tmp_path, tiny_run))],
                         capture_output=True, text=True)
    assert out.returncode == status and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) == 1 and all(t in out.stderr for t in texts)
    assert out.stderr.startswith(("error: ", "config error: "))


@pytest.mark.slow
def test_stdin_lines_end_at_newline_only(tiny_run):
    out = subprocess.run([ATTN_MT, "--quiet", "translate", "--checkpoint",
                          str(tiny_run / "checkpoint_best.pt"), "--device", "cpu"],
                         input=b"the dog\rsees a cat.\r\nthe old man.\n", capture_output=True)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.decode().splitlines()) == 2


def _outputs_over_inputs(tmp: Path, run: Path) -> dict[str, tuple[list, Path, int, str]]:
    """command -> (its arguments, the input its output names, exit status, what the line says):
    every command that writes a file, each asked to write over one of its inputs (as itself, a hard
    link or a symlink)."""
    ckpt, other, cfg, yaml_cfg = (tmp / "m.pt", tmp / "o.pt", write_config(tmp / "c.json"),
                                  tmp / "c.yaml")
    shutil.copy(run / "checkpoint_best.pt", ckpt)
    shutil.copy(ckpt, other)
    shutil.copy(cfg, yaml_cfg)
    (tmp / "m.json").hardlink_to(ckpt)
    (tmp / "m.html").symlink_to(ckpt)
    (tmp / "src.json").write_text("a dog .\n")
    (tmp / "ref.json").write_text("ein Hund .\n")
    run_copy = tmp / "run"  # a run directory: resumes from checkpoint_last.pt
    copy_run(run, run_copy)
    last = run_copy / "checkpoint_last.pt"
    same, text = "the same file as the input", ["--src", tmp / "src.json", "--ref",
                                                tmp / "ref.json"]
    return {
        "bench --json config": (["bench", "-c", cfg, "--json", cfg], cfg, 2,
                                f"--json {cfg}: {same}"),
        "bench --json checkpoint": (["bench", "-c", yaml_cfg, "--checkpoint", ckpt, "--json",
                                     tmp / "m.json"],
                                    ckpt, 2, f"{same} {ckpt}"),
        "average --out input": (["average", other, ckpt, "--out", ckpt], ckpt, 2,
                                f"--out {ckpt}: {same}"),
        "average --out symlink": (["average", other, tmp / "m.html", "--out", ckpt], ckpt, 2, same),
        "average --out run's last": (["average", other, ckpt, "--out", last], last, 2,
                                     f"--out {last}: a checkpoint name of the run in {run_copy}"),
        "heads --json ref": (["heads", "--checkpoint", ckpt, *text, "--json", tmp / "ref.json"],
                             tmp / "ref.json", 2, f"--json {tmp / 'ref.json'}: {same}"),
        "score --json src": (["score", "--checkpoint", ckpt, *text, "--json", tmp / "src.json"],
                             tmp / "src.json", 2, f"--json {tmp / 'src.json'}: {same}"),
        "explain --json": (["explain", "--checkpoint", ckpt, "a dog .", "--json", tmp / "m.json"],
                           ckpt, 2, same),
        "attention --out": (["attention", "--checkpoint", ckpt, "a dog .", "--out", ckpt], ckpt, 2,
                            f"--out {ckpt}: {ckpt} is a file, not a folder"),
        "attention --html": (["attention", "--checkpoint", ckpt, "a dog .", "--out", tmp / "figs",
                              "--html", tmp / "m.html"], ckpt, 2,
                             f"--html {tmp / 'm.html'}: {same}"),
        "export --out": (["export", "--checkpoint", ckpt, "--out", ckpt], ckpt, 2,
                         f"--out {ckpt}: {ckpt} is a file"),
        "export --out its folder": (["export", "--checkpoint", ckpt, "--out", tmp], ckpt, 1,
                                    f"{tmp}: holds {ckpt}, which this export reads; choose another "
                                    "--out"),
        "compare-rnn --out": (["compare-rnn", "-c", yaml_cfg, "--out", yaml_cfg], yaml_cfg, 2,
                              "is a file"),
        "download --out": (["download", "--out", yaml_cfg], yaml_cfg, 2,
                           f"--out {yaml_cfg}: {yaml_cfg} is a file"),
    }


@pytest.mark.parametrize("case", ["bench --json config", "bench --json checkpoint",
                                  "average --out input", "average --out symlink",
                                  "average --out run's last", "heads --json ref", "score --json "
                                  "src", "explain --json", "attention --out", "attention --html",
                                  "export --out", "export --out its folder", "compare-rnn --out",
                                  "download --out"])
def test_no_command_writes_over_its_input(case, tmp_path, tiny_run, monkeypatch):
    """Refused in one line before any work (nothing reads a checkpoint, benchmarks, trains or
    downloads), the input untouched."""
    import attn_mt.data.download
    import attn_mt.measure.bench
    import attn_mt.measure.compare

    args, victim, status, says = _outputs_over_inputs(tmp_path, tiny_run)[case]
    before = victim.read_bytes()

    def work(*args, **kwargs):
        raise AssertionError("work done before the output was checked")

    for module, name in [(torch, "load"), (attn_mt.measure.bench, "run_bench"),
                         (attn_mt.measure.compare, "compare_rnn"),
                         (attn_mt.data.download, "download")]:
        monkeypatch.setattr(module, name, work)
    one_line_error(cli(*args), status, says)
    assert victim.read_bytes() == before
