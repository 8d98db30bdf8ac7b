"""The package's plan as a test: which package may import which, read from every module's imports
(ast).

Data flows one way: config <- data <- models <- decoding <- training <- measure, with the CLI on
top (docs/architecture.md draws it). A module never reaches for another module's private
(`_name`) names, and the top level holds only the CLI, the
errors, files (atomic writes), checkpoint, run directory and device modules and the packages.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_mt"
TOP_MODULES = {"__init__", "__main__", "cli", "checkpoint", "device", "errors", "files", "rundir"}
PACKAGES = {"config", "data", "models", "decoding", "training", "measure", "export", "imports",
            "serve", "analysis", "api"}
BASE = {"config", "checkpoint", "device", "data", "models"}
# what each part of attn_mt may import besides itself (a part: a top-level module or a package);
# every part may import the bottom: attn_mt.errors (the error hierarchy, which imports nothing of
# attn_mt) and attn_mt.files (atomic writes, output checks: imports nothing of attn_mt but the
# errors)
BOTTOM = {"errors", "files"}
ALLOWED = {
    "errors": set(),
    "files": {"errors"},
    "config": set(),
    "device": {"config"},
    "data": {"config"},
    "models": {"config"},
    "checkpoint": {"config", "data", "models"},
    # the run directory's files: whoever reads runs
    "rundir": {"config", "data", "models", "checkpoint"},
    # knows nothing of exports: imports.ct2_translator chooses between a checkpoint and a folder
    "decoding": BASE,
    "export": BASE | {"rundir"},  # writes model folders; the run's files (the model card)
    # reads model folders back: a Translator
    "imports": {"config", "checkpoint", "data", "decoding", "export"},
    "training": BASE | {"decoding", "rundir"},  # validation and test BLEU
    "measure": BASE | {"decoding", "training"},  # the training step, never the run (below)
    # rundir: a run's attention history (analysis/history.py)
    "analysis": BASE | {"decoding", "rundir"},
    # the public API
    "api": BASE | {"decoding", "training", "measure", "export", "imports", "analysis", "rundir"},
    "serve": BASE | {"decoding", "api", "analysis"},  # a loaded model (api.Model)
    # names the public API; imports it lazily (tests/api)
    "__init__": BASE | PACKAGES | {"errors", "rundir"},
    "__main__": {"cli"},
    # every verb parses, calls the public API (or starts the server), prints
    "cli": {"api", "__init__", "serve"},
}


# The core a student reads (docs/reading.md walks it): the models, tokenizer, corpus and batches,
# one training loop, greedy and beam decoding, config, checkpoint, run directory. Everything else is
# an extra: speed machinery (data.prefetch, data.workers, training's autosize, compiled, deferred,
# muon, finetune, board, distributed), subword sampling, EMA, interop (imports, export), the server,
# analysis, measure and the public API. A core module never imports an extra when it loads: an extra
# is imported inside the function where the config chooses it.
CORE_PARTS = {"config", "models"}
CORE = {"attn_mt.errors", "attn_mt.files", "attn_mt.device", "attn_mt.checkpoint", "attn_mt.rundir",
        "attn_mt.data", "attn_mt.data.tokenizer", "attn_mt.data.pieces", "attn_mt.data.batching",
        "attn_mt.data.corpus", "attn_mt.data.plan", "attn_mt.data.arrays",
        "attn_mt.data.build", "attn_mt.data.cache", "attn_mt.data.lock", "attn_mt.data.checks",
        "attn_mt.data.sources", "attn_mt.data.lines", "attn_mt.data.toy", "attn_mt.data.pronoun",
        "attn_mt.data.tidy", "attn_mt.training", "attn_mt.training.trainer", "attn_mt.training.run",
        "attn_mt.training.schedule", "attn_mt.training.stops",
        "attn_mt.training.validation", "attn_mt.training.progress", "attn_mt.training.resume",
        "attn_mt.training.memory", "attn_mt.training.variants", "attn_mt.training.checks",
        "attn_mt.training.start", "attn_mt.training.evaluation", "attn_mt.training.finish",
        "attn_mt.training.interrupt", "attn_mt.decoding", "attn_mt.decoding.rules",
        "attn_mt.decoding.search", "attn_mt.decoding.beam",
        "attn_mt.decoding.translator", "attn_mt.decoding.metrics", "attn_mt.decoding.scoring",
        "attn_mt.decoding.translate"}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = modules()
CORE |= {m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in CORE_PARTS}


def part(module: str) -> str:
    """The top-level module or package a dotted name belongs to: attn_mt.data.cache -> data."""
    return module.split(".")[1] if "." in module else "__init__"


def imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module imported from, names, line) for every import in a file, relative ones
    resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return [row for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            for row in import_rows(node, package)]


def import_rows(node: ast.AST, package: str) -> list[tuple[str, list[str], int]]:
    """(absolute module, names, line) for an import statement of a module in `package`; [] for other
    nodes."""
    if isinstance(node, ast.Import):
        return [(a.name, [], node.lineno) for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [(base, [a.name for a in node.names], node.lineno)]


def targets(source: str, names: list[str]) -> list[str]:
    """The attn_mt modules an import statement reaches: `from attn_mt import checkpoint` reaches
    attn_mt.checkpoint, `from attn_mt.data.corpus import Corpus` reaches attn_mt.data.corpus."""
    if not source.startswith("attn_mt"):
        return []
    subs = [f"{source}.{n}" for n in names if f"{source}.{n}" in MODULES]
    return subs or [source]


def violations(mods: dict[str, Path]) -> list[str]:
    found = []
    for module, path in mods.items():
        where = f"{path.relative_to(ROOT)}"
        own = part(module)
        for source, names, line in imports(module, path):
            for target in targets(source, names):
                other = part(target)
                if other != own and other not in BOTTOM and other not in ALLOWED.get(own, set()):
                    found.append(f"{where}:{line}: {own} may not import {target}")
                if target == "attn_mt.training.run" and own != "api":
                    found.append(f"{where}:{line}: only the public API imports the training run "
                                 f"({target})")
                if target == "attn_mt.cli" and own != "__main__":
                    found.append(f"{where}:{line}: nothing imports the CLI")
            if source.startswith("attn_mt") or source.startswith("."):
                for name in names:
                    if name.startswith("_") and not name.startswith("__"):
                        found.append(f"{where}:{line}: imports the private name {name} of {source}")
        found += private_attributes(path, where)
    return found


def private_attributes(path: Path, where: str) -> list[str]:
    """`mod._name` where `mod` is an imported attn_mt module (e.g. `from attn_mt import rundir`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attn_mt"):
            bound |= {a.asname or a.name for a in node.names
                      if f"{node.module}.{a.name}" in MODULES}
        elif isinstance(node, ast.Import):
            bound |= {a.asname for a in node.names if a.asname and a.name.startswith("attn_mt")}
    return [f"{where}:{node.lineno}: uses the private name {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in bound and node.attr.startswith("_")
            and not node.attr.startswith("__")]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the attn_mt modules it imports, every import counted (at the top, in a function,
    for type checking only); a package's __init__ is the package's own module."""
    return {m: {t for source, names, _ in imports(m, path) for t in targets(source, names)
                if t in mods and t != m}
            for m, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan's
    algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No module reaches itself through the imports of others, not even through a lazy or a
    type-only import: what two modules share lives in the one that owns it, below both."""
    found = cycles(import_graph(MODULES))
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []

def test_top_level_holds_only_the_cli_config_checkpoint_device_and_the_packages():
    entries = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert entries - PACKAGES == TOP_MODULES, entries - PACKAGES - TOP_MODULES
    assert PACKAGES <= entries


def test_every_part_is_known():
    assert {part(m) for m in MODULES} <= set(ALLOWED)


def test_imports_follow_the_rules():
    assert violations(MODULES) == []


def test_scripts_use_no_private_names():
    found = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        where = str(path.relative_to(ROOT))
        for source, names, line in imports("scripts." + path.stem, path):
            found += [f"{where}:{line}: {source}.{n}" for n in names
                      if source.startswith("attn_mt") and n.startswith("_")
                      and not n.startswith("__")]
        found += private_attributes(path, where)
    assert found == []


def declared_imports(doc: str) -> tuple[set[str], set[str]]:
    """(parts it may import, parts it never imports) from a docstring's sentence "May import a, b
    (why) and c; never x or y." (parentheses and backticks ignored; "nothing" is none)."""
    text = re.sub(r"\([^)]*\)|`", "", " ".join(doc.split()))
    found = (re.search(r"May import (.*?)(?:;|:)\s*never (.*?)(?:\.(?:\s|$)|;|$)", text)
             or re.search(
        r"May import (.*?)(?:\.(?:\s|$)|;|$)()", text))
    if not found:
        return set(), set()
    known = set(ALLOWED) - {"__init__", "__main__"}
    return tuple({w.removeprefix("attn_mt.") for w in re.findall(r"[\w.]+", group)} & known
                 for group in found.groups())


def test_every_package_docstring_says_what_it_may_import():
    """Each package's __init__ docstring names exactly the parts the rules above let it import."""
    for name in sorted(PACKAGES):
        doc = (
            ast.get_docstring(
                ast.parse((PACKAGE / name / "__init__.py").read_text(encoding="utf-8"))) or "")
        assert ("May import" in doc), (f"attn_mt/{name}/__init__.py: the docstring has no 'May "
                                       "import ...' sentence")
        may, never = declared_imports(doc)
        assert (may == ALLOWED[name]), (f"attn_mt/{name}/__init__.py says it may import "
                                        f"{sorted(may)}, the rules allow {sorted(ALLOWED[name])}")
        assert (not never & ALLOWED[name]), (f"attn_mt/{name}/__init__.py forbids what the rules "
                                             f"allow: {never}")


@pytest.mark.parametrize("doc,may,never", [
    ("May import `attn_mt.config` only: never data, training or serve.", {"config"},
     {"data", "training", "serve"}),
    ("May import config, checkpoint, device, data, models and decoding; never training, measure, "
     "export or serve.", BASE | {"decoding"}, {"training", "measure", "export", "serve"}),
    ("Owns X.\n\nMay import config, data (the tokenizer) and\n  decoding; never the training run.",
     {"config", "data", "decoding"}, {"training"}),
    ("May import nothing of attn_mt.", set(), set()),
])
def test_the_docstring_rule_is_read_as_written(doc, may, never):
    assert declared_imports(doc) == (may, never)


# the names of a run directory's files (training/rundir.py) and what joins a path inside one
RUN_DIR_NAMES = re.compile(
    r"(config\.yaml|results\.json|metrics\.jsonl|tokenizer\.json|test_hyps\.txt|tensorboard"
                           r"|size\.json|.*\.contrastive\.jsonl|.*\.align|checkpoint_.*|spm\..*|attention_history\.npz)")
RUN_DIR_PATHS = re.compile(r"\brun_dir\b|\bfiles\.path\b|\brun_path\b")


def run_dir_joins(path: Path, where: str) -> list[str]:
    """`x / "results.json"`, `x / f"checkpoint_{n}.pt"`, `run_dir / anything`, `files.path /
    anything`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            parts = right.values if isinstance(right, ast.JoinedStr) else [right]
            literal = "".join(v.value for v in parts if isinstance(v, ast.Constant)
                              and isinstance(v.value, str))
            if (RUN_DIR_NAMES.fullmatch(literal.rpartition("/")[2])
                or RUN_DIR_PATHS.search(ast.unparse(node.left))):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_rundir_joins_a_path_inside_a_run_directory():
    """training/rundir.py owns the run directory's files: no other module (or script) names one."""
    files = [p for p in MODULES.values() if p != PACKAGE / "rundir.py"]
    found = [hit for p in [*files, *sorted((ROOT / "scripts").glob("*.py"))]
             for hit in run_dir_joins(p, str(p.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("code", ['(run_dir / "results.json").read_text()\n',
                                  'x = files.path / "spm.model"\n',
                                  'p = out / f"checkpoint_step{step:07d}.pt"\n',
                                  'p = self.run_dir / f"{split}.{lang}"\n'])
def test_a_run_directory_path_built_elsewhere_is_caught(code, tmp_path):
    (tmp_path / "bad.py").write_text(code)
    assert len(run_dir_joins(tmp_path / "bad.py", "bad.py")) == 1


@pytest.mark.parametrize("code,expected", [
    ("from attn_mt.data.corpus import Corpus\n", "models may not import attn_mt.data.corpus"),
    ("from attn_mt.training import trainer\n", "models may not import attn_mt.training.trainer"),
    ("from attn_mt.checkpoint import _first_line\n", "imports the private name _first_line"),
    ("from attn_mt import rundir\nx = rundir._tmp\n", "uses the private name rundir._tmp"),
])
def test_a_forbidden_import_is_caught(code, expected, tmp_path):
    """The checker itself: a models module with a forbidden import is reported (so the test can
    fail)."""
    path = tmp_path / "attn_mt" / "models" / "bad.py"
    path.parent.mkdir(parents=True)
    path.write_text(code)
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = violations({"attn_mt.models.bad": path})
    finally:
        ROOT = root
    assert any(expected in line for line in found), found


def test_the_measure_package_may_not_import_the_training_run(tmp_path):
    path = tmp_path / "attn_mt" / "measure" / "bad.py"
    path.parent.mkdir(parents=True)
    path.write_text("from attn_mt.training.run import train\nfrom attn_mt.training.trainer import "
                    "Trainer\n")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = violations({"attn_mt.measure.bad": path})
    finally:
        ROOT = root
    assert found == ["attn_mt/measure/bad.py:1: only the public API imports the training run "
                     "(attn_mt.training.run)"]


def test_no_test_module_imports_another():
    """Test modules share helpers through tests/conftest.py only, never `from test_x import ...`."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for source, _, line in imports("tests." + path.stem, path):
            if source.split(".")[0].startswith("test_"):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {source}")
    assert found == []

ARCHITECTURE = ROOT / "docs" / "architecture.md"  # the doc that must agree with the rules

def rundir_names() -> set[str]:
    """The file names RunDir joins to its folder (`self.path / "results.json"`), `{...}` parts as
    `*`."""
    names = set()
    for node in ast.walk(ast.parse((ROOT / "attn_mt" / "rundir.py").read_text(encoding="utf-8"))):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            and ast.unparse(node.left) == "self.path"):
            right = node.right
            parts = right.values if isinstance(right, ast.JoinedStr) else [right]
            names.add("".join(p.value if isinstance(p, ast.Constant) else "*" for p in parts))
    # not a variable's name, nor a hidden probe
    return {n for n in names if n != "*" and not n.startswith(".")}


def test_every_file_of_the_run_directory_is_in_the_doc_and_the_layout_rule():
    names = rundir_names()
    assert {"config.yaml", "results.json", "size.json", "*.contrastive.jsonl",
            "checkpoint_step*.pt"} <= names
    section = ARCHITECTURE.read_text(encoding="utf-8").split("## What a run writes")[1].split(
        "Training uses")[0]
    table = {re.sub(r"\{[^}]*\}", "*", cell).rstrip("/")
             for cell in re.findall(r"`([^`]+)`", section)}
    assert names <= table, f"not in docs/architecture.md's table: {sorted(names - table)}"
    # {split}.{lang} has no fixed part for a rule to name
    for name in (n for n in names if n.strip("*.")):
        assert RUN_DIR_NAMES.fullmatch(name.replace("*", "x")), (
            f"{name}: not in test_layout's RUN_DIR_NAMES")


def test_the_causal_mask_has_one_owner():
    """models.attention.causal_mask builds it; the attention module and explain's recomputation call
    it."""
    for path in (ROOT / "attn_mt").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        # the exported modeling file stands alone
        if path.name not in ("attention.py", "modeling_attn_mt.py"):
            assert ".tril(" not in text, f"{path.relative_to(ROOT)} builds a causal mask of its own"
    assert "`causal_mask`" in ARCHITECTURE.read_text(encoding="utf-8")


def test_files_are_put_in_place_by_one_module():
    """attn_mt/files.py renames files and folders into place (atomically, durably); nothing else
    renames."""
    renames = re.compile(r"\bos\.(replace|rename|renames)\(|\.rename\(|Path\.replace\(")
    for path in PACKAGE.rglob("*.py"):
        if path != PACKAGE / "files.py":
            found = renames.search(path.read_text(encoding="utf-8"))
            assert (found
                    is None), f"{path.relative_to(ROOT)} renames a file itself ({found.group(0)})"


def test_long_files_say_their_one_job_and_no_function_is_long():
    """A file over 250 lines says its one job in its docstring ("One job: ..."); no function is over
    60 lines."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        if text.count("\n") > 250:
            assert "\nOne job: " in (ast.get_docstring(tree, clean=False)
                                     or ""), f"{path.relative_to(ROOT)}"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                assert lines <= 60, f"{path.relative_to(ROOT)}: {node.name} is {lines} lines"


def test_every_module_has_a_test_file_or_says_where_it_is_tested():
    """attn_mt/x/y.py is tested in a tests/**/test_y.py, or its docstring says where ("Tested in
    ...")."""
    tested = {p.stem.removeprefix("test_") for p in (ROOT / "tests").rglob("test_*.py")}
    for path in PACKAGE.rglob("*.py"):
        stem = path.parent.name if path.name == "__init__.py" else path.stem
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if stem not in tested and path.parent != PACKAGE / "static":
            assert "Tested in " in doc or (path.name == "__init__.py" and path.parent != PACKAGE), \
                f"{path.relative_to(ROOT)}: no tests/**/test_{stem}.py and no 'Tested in' line"


def load_time_imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """The imports a module runs when it loads: at its top level, in its top-level if/try blocks,
    never under `if TYPE_CHECKING:` nor inside a function (where an extra is imported at its
    seam)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, list[str], int]] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.extend(import_rows(node, package))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for handler in node.handlers:
                    walk(handler.body)
                walk(node.orelse)
                walk(node.finalbody)

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def extras_loaded_by_the_core(mods: dict[str, Path], core: set[str]) -> list[str]:
    return [f"{m} imports {t} (line {line}), an extra, when it loads"
            for m in sorted(core & set(mods)) for source, names,
            line in load_time_imports(m, mods[m]) for t in targets(source, names) if t not in core]


def test_the_core_imports_no_extra_when_it_loads():
    assert CORE <= set(MODULES), sorted(CORE - set(MODULES))
    assert not extras_loaded_by_the_core(MODULES, CORE)


def test_an_extra_imported_by_the_core_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import TYPE_CHECKING\nfrom attn_mt.training import muon\nif "
                   "TYPE_CHECKING:\n    from attn_mt.serve import app\n\ndef seam():\n    from "
                   "attn_mt.training import compiled\n")
    assert extras_loaded_by_the_core({"attn_mt.training.bad": bad}, {"attn_mt.training.bad"}) == [
        "attn_mt.training.bad imports attn_mt.training.muon (line 2), an extra, when it loads"]


READING = ROOT / "docs" / "reading.md"
ENTRY = re.compile(r"^\d+\. \[[^\]]+\]\(\.\./(attn_mt/[^)]+\.py)\): (.*?)(?=^\d+\. |^\S|\Z)",
                   re.M | re.S)


def defined(path: Path) -> set[str]:
    """A file's top-level functions and classes, and Class.method for their methods."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def test_the_reading_path_lists_at_most_twelve_core_files_and_the_names_they_define():
    entries = ENTRY.findall(READING.read_text(encoding="utf-8"))
    assert 8 <= len(entries) <= 12 and len({p for p, _ in entries}) == len(entries)
    by_path = {p.relative_to(ROOT).as_posix(): m for m, p in MODULES.items()}
    for path, text in entries:
        assert by_path.get(path) in CORE, f"{path} is not a module of the core"
        # [file](path)'s `name`
        elsewhere = re.findall(r"\]\(\.\./(attn_mt/[^)]+\.py)\)'s `([\w.]+)`", text)
        for other, name in elsewhere:
            assert name in defined(ROOT / other), f"{other}: {name} is not defined there"
        quoted = set(re.findall(r"`([A-Za-z_][\w.]*)`", text)) - {name for _, name in elsewhere}
        assert (quoted
                <= defined(ROOT / path)), (f"{path}: {sorted(quoted - defined(ROOT / path))} not "
                                           "defined there")


# What the reading path may not talk about: serving, interop and machine speed live outside it
NOT_THE_IDEA = re.compile(r"marian|running batch|\brows?\b|graphs?\b|prefetch|meminfo|rlimit|gloo",
                          re.I)
# the path calls them to train and decode
CALLED = ["attn_mt/models/seq2seq.py", "attn_mt/decoding/beam.py"]


def reading_files() -> list[Path]:
    """docs/reading.md's files and the files they call to train and decode."""
    listed = [p for p, _ in ENTRY.findall(READING.read_text(encoding="utf-8"))]
    return [ROOT / p for p in dict.fromkeys(listed + CALLED)]


def test_the_reading_path_is_an_afternoon_of_the_idea_only():
    """<= 1,600 lines in all, no file over 250, and not a word of serving, interop or machine
    speed."""
    sizes = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8").count("\n")
             for p in reading_files()}
    assert sum(sizes.values()) <= 1600, sizes
    assert max(sizes.values()) <= 250, sizes
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in reading_files()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in [NOT_THE_IDEA.search(line)] if m]
    assert found == []


@pytest.mark.parametrize("line", ["# the running batch's rows", "import gloo", "MarianSinusoidal",
                                  "x = graphs[0]", "read /proc/meminfo"])
def test_a_word_off_the_path_is_caught(line):
    assert NOT_THE_IDEA.search(line)


def test_modules_stay_within_their_limits():
    """A module a reader holds in mind at once: <= 350 lines; the CLI, which only parses and prints,
    <= 300."""
    sizes = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8").count("\n")
             for p in PACKAGE.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 350} == {}
    assert sizes["attn_mt/cli.py"] <= 300


def test_the_code_passes_ruff():
    """ruff check (pyproject.toml: line length 100, pycodestyle, pyflakes, isort, bugbear,
    pyupgrade)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (the dev extra)")
    done = subprocess.run([ruff, "check", "--no-cache", "attn_mt", "tests", "scripts"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
