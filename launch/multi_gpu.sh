#!/usr/bin/env bash
# One host, every GPU (jit mesh or pmap over them; bfloat16 for training). Needs pip install -U "jax[cuda12]".
#   CUDA_VISIBLE_DEVICES=0,1,2,3 launch/multi_gpu.sh --pipeline --config=configs/base_encoder.py --workdir=runs/encoder
exec python -m headspec.launch multi-gpu "$@"
