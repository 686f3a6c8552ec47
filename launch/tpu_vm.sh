#!/usr/bin/env bash
# Cloud TPU VM or pod slice: (--create) the VM, install a wheel built here plus jax[tpu] on every worker,
# stage --data (gs:// folder or local folder) on every worker, train on all workers, analyses on worker 0.
#   TPU_NAME=my-tpu ZONE=us-central2-b launch/tpu_vm.sh --data=gs://bucket/data \
#       --pipeline --config=configs/base_decoder.py --workdir=gs://bucket/runs/decoder
exec python -m headspec.launch tpu "$@"
