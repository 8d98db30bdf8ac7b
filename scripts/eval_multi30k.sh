#!/bin/sh
# Score a checkpoint on Multi30k test2016, test2017 and test2018 (sacreBLEU and chrF, the
# checkpoint's own beam settings), one JSON line per test set.
# usage: scripts/eval_multi30k.sh CHECKPOINT SRC_LANG TGT_LANG [DATA_DIR (default $MULTI30K_DIR)]
set -eu
ckpt=$1 src=$2 tgt=$3 dir=${4:-${MULTI30K_DIR:-data/multi30k}}
for set in test2016 test2017 test2018; do
    attn-mt --quiet evaluate --checkpoint "$ckpt" --src "$dir/$set.$src" --ref "$dir/$set.$tgt" --json |
        python -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'test': '$set', 'bleu': \
r['bleu'], 'chrf': r['chrf'], 'beam': r['decode']['beam_size'], 'signature': r['bleu_signature']}))"
done
