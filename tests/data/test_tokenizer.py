from conftest import cli, one_line_error, write_config

from attn_mt.config import TokenizerConfig
from attn_mt.data.pieces import SMALL_BATCH
from attn_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer
from attn_mt.data.toy import make_toy_corpus

PAIRS = make_toy_corpus(300)["train"]
SRC, TGT = [s for s, _ in PAIRS], [t for _, t in PAIRS]


def test_round_trip_and_special_ids():
    tok = train_tokenizer(TokenizerConfig(vocab_size=150), SRC, TGT)
    assert ((tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
            == (0, 1, 2, 3))
    assert tok.src.id_to_piece(0) == "<pad>" and tok.src.id_to_piece(3) == "</s>"
    ids = tok.encode_tgt(TGT[:5])
    assert tok.decode_tgt(ids) == TGT[:5]
    assert all(i > EOS_ID for s in ids for i in s)  # specials are never produced by encoding
    assert tok.joint and list(tok.files()) == ["spm.model"]


def test_few_texts_are_coded_one_at_a_time_as_sentencepiece_codes_them_together():
    tok = train_tokenizer(TokenizerConfig(vocab_size=150), SRC, TGT)
    for n in (0, 1, SMALL_BATCH - 1, SMALL_BATCH, 3 * SMALL_BATCH):
        texts = [*SRC[:n - 1], ""][:n]  # an empty text among them
        ids = tok.encode_src(texts)
        assert ids == tok.src.encode(texts) and len(ids) == n
        # SentencePiece decodes [] as ""
        assert tok.decode_tgt(ids) == (tok.tgt.decode(ids) if n else [])


def test_separate_vocabularies_and_state():
    tok = train_tokenizer(TokenizerConfig(vocab_size=100, joint=False), SRC, TGT)
    assert not tok.joint and list(tok.files()) == ["spm.src.model", "spm.tgt.model"]
    assert Tokenizer.from_files(tok.files()).state() == tok.state()
    again = Tokenizer.from_state(tok.state())
    assert again.encode_src(SRC[:3]) == tok.encode_src(SRC[:3])
    assert again.decode_tgt(tok.encode_tgt(TGT[:3])) == TGT[:3]


def test_a_vocabulary_too_small_for_the_characters_is_a_config_error(tmp_path):
    config = write_config(tmp_path / "c.yaml", "tokenizer.vocab_size=16")
    one_line_error(cli("train", "-c", config, "--out", tmp_path / "run"), 2,
                   "tokenizer.vocab_size=16")
