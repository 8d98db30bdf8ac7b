"""The YAML reader behind load_config: safe loading, errors with file, line and key, short messages."""

from __future__ import annotations

from conftest import cli


def test_yaml_alias_bomb_gives_a_short_message(tmp_path):
    """9 levels of 9 aliases: 9^9 elements if an error message printed the value."""
    levels = ["&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    for key in ("model:\n  d_model", "train:\n  betas", "compare_me"):
        bomb = tmp_path / "bomb.yaml"
        bomb.write_text(f"{key}: [{', '.join(levels)}]\n")
        result = cli("train", "-c", bomb, "--out", tmp_path / "run")
        assert result.exit_code == 2 and len(result.stderr) < 400, result.stderr[:400]
