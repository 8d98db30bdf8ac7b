#!/bin/sh
# Score a checkpoint on Multi30k test2016, test2017 and test2018 (sacreBLEU and chrF), one JSON
# line per test set. Decoding follows the checkpoint's config unless options for `attn-mt
# evaluate` follow (e.g. --alpha 1.0). Data: $MULTI30K_DIR (default data/multi30k).
# usage: scripts/eval_multi30k.sh CHECKPOINT SRC_LANG TGT_LANG [EVALUATE_OPTIONS...]
set -eu
ckpt=$1 src=$2 tgt=$3 dir=${MULTI30K_DIR:-data/multi30k}
shift 3
for set in test2016 test2017 test2018; do
    attn-mt --quiet evaluate --checkpoint "$ckpt" --src "$dir/$set.$src" --ref "$dir/$set.$tgt" --json "$@" |
        python -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'test': '$set', 'bleu': \
r['bleu'], 'chrf': r['chrf'], **r['decode'], 'signature': r['bleu_signature']}))"
done
