#!/usr/bin/env bash
# Cloud TPU VM (single host or pod slice): install headspec on every worker and train on all of them.
#   TPU_NAME=my-tpu ZONE=us-central2-b launch/tpu_vm.sh configs/base_decoder.py gs://bucket/runs/decoder
# Multi-host: each worker runs the same command; --config.multihost=True calls jax.distributed.initialize(),
# which finds the coordinator on Cloud TPU by itself, and each host loads only its share of every batch.
# The workdir must be shared by all hosts (a gs:// bucket: orbax and tensorboardX write there directly),
# and so must HEADSPEC_DATA_DIR (copy the data to each worker's disk, or mount a bucket with gcsfuse).
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
DATA=${HEADSPEC_DATA_DIR_REMOTE:-/home/$USER/data}
REPO=${HEADSPEC_REPO:-https://github.com/your-org/headspec.git}
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  set -e
  [ -d headspec ] || git clone $REPO headspec
  cd headspec && git pull -q
  pip install -q -U 'jax[tpu]' && pip install -q -e .
  HEADSPEC_DATA_DIR=$DATA headspec train --config=$config --workdir=$workdir --config.multihost=True \
      --config.model.dtype=bfloat16 $*
"
