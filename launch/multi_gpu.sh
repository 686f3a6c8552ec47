#!/usr/bin/env bash
# One host, several GPUs: JAX sees them all; the jit mesh (default) or pmap shards the batch over them.
#   CUDA_VISIBLE_DEVICES=0,1,2,3 launch/multi_gpu.sh configs/base_encoder.py runs/encoder [--config.parallelism=pmap]
# Needs JAX with CUDA: pip install -U "jax[cuda12]". train.batch_size must divide by the GPU count.
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
: "${HEADSPEC_DATA_DIR:?set HEADSPEC_DATA_DIR}"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
python -c "import jax; print('devices:', jax.devices())"
exec headspec train --config="$config" --workdir="$workdir" --config.model.dtype=bfloat16 "$@"
